"""The persistent input batch (engine/worker/input_batch.py): what it gives a
step equals the inputs rebuilt from the sequences' lists, over steps where
requests decode, gain blocks, finish, join, and are preempted and resumed;
and greedy ids of a staggered batch equal each prompt's alone."""
from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import make_checkpoint

from engine.worker.input_batch import InputBatch

BS = 4  # tokens a block


def seq(rid: str, tokens: int, first_block: int) -> SimpleNamespace:
    s = SimpleNamespace(request_id=rid, token_ids=list(range(100, 100 + tokens)), block_table=[])
    grow(s, first_block)
    return s


def grow(s, next_block: int) -> int:
    """Blocks for its tokens, numbered from next_block: the next free number."""
    while len(s.block_table) * BS < len(s.token_ids):
        s.block_table.append(next_block)
        next_block += 1
    return next_block


def rebuilt(seqs) -> tuple[torch.Tensor, ...]:
    """A decode step's inputs as the runner built them from the lists."""
    width = max(len(s.block_table) for s in seqs)
    pos = [len(s.token_ids) - 1 for s in seqs]
    return (torch.tensor([s.token_ids[-1] for s in seqs]), torch.tensor(pos),
            torch.tensor([s.block_table[p // BS] * BS + p % BS for s, p in zip(seqs, pos)]),
            torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in seqs],
                         dtype=torch.int32),
            torch.tensor([len(s.token_ids) for s in seqs], dtype=torch.int32))


def check(batch: InputBatch, seqs) -> None:
    batch.update(seqs)
    got = batch.decode_inputs(len(seqs))
    for name, g, want in zip(("ids", "positions", "slots", "tables", "seq_lens"), got,
                             rebuilt(seqs)):
        assert g.dtype == want.dtype and torch.equal(g, want), (name, g, want)


def test_steps_with_joins_finishes_and_preemptions_match_rebuilt_inputs():
    rng = random.Random(0)
    batch = InputBatch(BS, torch.device("cpu"), rows=2, width=2)  # grows past both
    running, next_block, n = [], 1, 0
    for step in range(300):
        if not running or rng.random() < 0.15:  # a request joins (or resumes) at the end
            s = seq(f"r{n}", rng.randrange(1, 30), next_block)
            next_block = grow(s, next_block + len(s.block_table))
            running.append(s)
            n += 1
        if len(running) > 1 and rng.random() < 0.1:  # one finishes
            running.pop(rng.randrange(len(running)))
        if running and rng.random() < 0.05:  # preempted: its blocks freed, new ones later
            victim = rng.choice(running)
            victim.block_table = []  # the KV cache manager gives a freed table a new list
            next_block = grow(victim, next_block + 50)
        if rng.random() < 0.1:
            rng.shuffle(running)
        for s in running:  # each decoded a token
            s.token_ids.append(rng.randrange(1000))
            next_block = grow(s, next_block)
        check(batch, running)
    assert batch.block_table.shape[0] > 2 and batch.block_table.shape[1] > 2


def test_a_row_refilled_has_zeros_past_its_blocks():
    batch = InputBatch(BS, torch.device("cpu"))
    long, short = seq("a", 40, 1), seq("b", 3, 50)
    check(batch, [long])
    check(batch, [short, long])  # row 0 held a's ten blocks; b has one
    assert batch.block_tables(2)[0].tolist() == [50] + [0] * 9


def test_a_resumed_sequence_gets_its_new_blocks():
    """A step after a preemption reads the resumed sequence's new blocks."""
    batch = InputBatch(BS, torch.device("cpu"))
    a = seq("a", 9, 1)
    check(batch, [a])
    a.block_table = [7, 8, 9]
    batch.update([a])
    assert batch.block_tables(1).tolist() == [[7, 8, 9]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ib") / "m", "llama")


def test_staggered_batch_greedy_ids_equal_each_prompt_alone(tiny):
    """Requests finishing at different steps (rows reordered as they leave)
    and a cache small enough to preempt: the same ids as each alone."""
    from engine import LLM, SamplingParams

    llm = LLM(model=str(tiny), dtype="float32", block_size=32, num_kv_blocks=6, max_num_seqs=6,
              max_model_len=64, bind_threads=False)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 100) for _ in range(rng.randrange(3, 12))] for _ in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=24 + 4 * i, ignore_eos=True)
              for i in range(6)]
    together = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert llm.core.scheduler.num_preemptions > 0
    for p, sp, out in zip(prompts, params, together):
        alone = llm.generate(prompt_token_ids=[p], sampling_params=sp)[0]
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids
