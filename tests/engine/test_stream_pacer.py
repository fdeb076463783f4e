"""How often a streamed request's reader hears of its tokens: `--stream-interval
N|auto` (engine/entrypoints/openai/stream_pacer.py), applied by the front end's
OutputProcessor (every N tokens merged into one update, a request's first and
last at once) and, in `auto`, by AsyncLLM.generate(): every output the core
sends, and a reader that fell behind gets what came meanwhile as one update."""
from __future__ import annotations

import asyncio

import pytest

from engine.core.messages import EngineCoreOutput
from engine.core.output_processor import OutputProcessor, RequestState
from engine.entrypoints.openai.stream_pacer import parse_interval
from engine.sampling_params import SamplingParams


class Updates(list):
    """A request's reader queue, as the server's asyncio.Queue takes them."""

    put_nowait = list.append


@pytest.fixture
def tok():
    """A tokenizer of single letters: id i is chr(97 + i)."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {chr(97 + i): i for i in range(26)}
    t = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    t.decoder = decoders.Fuse()  # the letters joined, no spaces: id i is one character
    return t


def request(tok, interval: int, **params):
    out = OutputProcessor(stream_interval=interval)
    state = RequestState("r", None, [0, 1], SamplingParams(max_tokens=64, **params), 0, tok)
    state.queue = Updates()
    out.add(state)
    return out, state


def feed(out, ids_per_step, last_reason="length", logprobs=False):
    for n, ids in enumerate(ids_per_step):
        reason = last_reason if n == len(ids_per_step) - 1 else None
        out.process_outputs([EngineCoreOutput(
            "r", list(ids), new_logprobs=[(-0.5, [])] * len(ids) if logprobs else None,
            finish_reason=reason)])


def test_every_output_with_interval_1(tok):
    out, state = request(tok, 1)
    feed(out, [[2], [3], [4, 5], [6]])
    assert [u.new_token_ids for u in state.queue] == [[2], [3], [4, 5], [6]]
    assert [u.text for u in state.queue] == ["c", "d", "ef", "g"]
    assert [u.finish_reason for u in state.queue] == [None, None, None, "length"]


def test_every_n_tokens_merged_with_n(tok):
    out, state = request(tok, 3, logprobs=0)
    feed(out, [[i] for i in range(2, 10)], logprobs=True)  # 8 tokens, one a step
    assert [u.new_token_ids for u in state.queue] == [[2], [3, 4, 5], [6, 7, 8], [9]]
    assert [u.text for u in state.queue] == ["c", "def", "ghi", "j"]  # their texts joined
    assert [len(u.logprobs) for u in state.queue] == [1, 3, 3, 1]
    assert [u.finish_reason for u in state.queue] == [None, None, None, "length"]
    assert state.text == "cdefghij" and state.output_token_ids == list(range(2, 10))


def test_first_tokens_and_ends_are_never_held_back(tok):
    for interval in (4, 100):
        out, state = request(tok, interval)
        feed(out, [[2]], last_reason=None)
        assert [u.new_token_ids for u in state.queue] == [[2]]  # the first token: at once
        feed(out, [[3]], last_reason=None)
        assert len(state.queue) == 1 and state.pending.new_token_ids == [3]  # held back
        feed(out, [[4]])  # the end: at once, with what was held back
        assert [u.new_token_ids for u in state.queue] == [[2], [3, 4]]
        assert state.queue[-1].finish_reason == "length" and state.pending is None
        assert "".join(u.text for u in state.queue) == state.text == "cde"


def test_an_output_of_n_tokens_is_not_held_back(tok):
    out, state = request(tok, 3)
    feed(out, [[2], [3, 4, 5], [6], [7, 8], [9]], last_reason=None)
    assert [u.new_token_ids for u in state.queue] == [[2], [3, 4, 5], [6, 7, 8]]
    assert state.pending.new_token_ids == [9]


def test_a_stop_string_ends_a_held_back_stream_at_once(tok):
    """A stop string found in held-back tokens ends the request then: the reader
    hears of the tokens before it, and the caller is told to abort it in the core."""
    out, state = request(tok, 4, stop=["fg"])
    feed(out, [[2], [3]], last_reason=None)
    assert out.process_outputs([EngineCoreOutput("r", [4])]) == []
    assert out.process_outputs([EngineCoreOutput("r", [5, 6, 7])]) == ["r"]
    assert [u.new_token_ids for u in state.queue] == [[2], [3, 4, 5, 6]]
    last = state.queue[-1]
    assert last.finish_reason == "stop" and last.stop_reason == "fg"
    assert "".join(u.text for u in state.queue) == state.text == "cde"
    assert not out.has_unfinished()


def test_a_reader_that_fell_behind_gets_one_update(tmp_path):
    """auto (and any interval): the outputs a reader has not read yet reach it
    as one update, their tokens and text joined, in AsyncLLM.generate()."""
    from helpers import async_llm_in_process
    from test_serve_parts import StepGate

    from engine.core.output_processor import merged
    from engine.tiny_model import make_tiny_model

    llm = async_llm_in_process(make_tiny_model(tmp_path / "tiny"))
    assert llm.output.stream_interval == 1  # AsyncLLM's default, and `auto`'s
    gate = StepGate(llm.core)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)

    async def main():
        reader = asyncio.ensure_future(llm.run())
        try:
            state = await llm.make_request("one two", params)
            gen = llm.generate(state)
            gate.allow()
            first = await asyncio.wait_for(gen.__anext__(), 30)
            gate.allow(3)  # three steps while the reader does not read
            while state.num_output_tokens < 4:
                await asyncio.sleep(0.001)
            behind = list(state.queue._queue)  # noqa: SLF001 - what waits for the reader
            caught_up = await asyncio.wait_for(gen.__anext__(), 30)
            gate.open()
            rest = [u async for u in gen]
        finally:
            gate.open()
            llm.shutdown()
        await asyncio.wait_for(reader, 30)
        return state, first, behind, caught_up, rest

    state, first, behind, caught_up, rest = asyncio.run(main())
    assert len(first.new_token_ids) == 1
    assert [len(u.new_token_ids) for u in behind] == [1, 1, 1]  # one an output...
    want = merged(merged(behind[0], behind[1]), behind[2])
    assert caught_up == want and len(caught_up.new_token_ids) == 3  # ...read as one
    assert [len(u.new_token_ids) for u in rest] == [1] and rest[-1].finish_reason == "length"
    assert first.text + caught_up.text + rest[0].text == state.text
    assert first.new_token_ids + caught_up.new_token_ids + rest[0].new_token_ids == \
        state.output_token_ids


@pytest.mark.parametrize("text,want", [("auto", None), ("1", 1), ("4", 4)])
def test_interval_values(text, want):
    assert parse_interval(text) == want


@pytest.mark.parametrize("text", ["0", "-2", "two", "", "1.5"])
def test_bad_interval_values_name_the_valid_ones(text):
    with pytest.raises(ValueError, match=r"--stream-interval must be 'auto' or a positive"):
        parse_interval(text)
