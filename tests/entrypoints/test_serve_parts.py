"""The server's parts without a server: chat templates against transformers,
models by Hugging Face id from the cache, the tiny model, the engine core's
live loop (join, leave, abort), and a fast `engine --help`."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

transformers = pytest.importorskip("transformers",
                                   reason="a dev requirement (requirements/dev.txt)")

TEMPLATES = {
    "tiny": None,  # the tiny model's own
    # the features real templates use: raise_exception, loop controls, tojson,
    # trim/lstrip of blocks, namespace, the special tokens
    "features": (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}\n"
        "{{ bos_token }}\n"
        "{% set ns = namespace(n=0) %}\n"
        "{% for m in messages %}\n"
        "  {% if m['role'] == 'skip' %}{% continue %}{% endif %}\n"
        "  {% set ns.n = ns.n + 1 %}\n"
        "  [{{ ns.n }}] {{ m['role'] | upper }}: {{ m['content'] | trim }} {{ m | tojson }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}{{ eos_token }}"),
}
MESSAGES = [{"role": "system", "content": "Be brief. Ünïcode ok"},
            {"role": "user", "content": "  Hello?  "}, {"role": "skip", "content": "no"},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again"}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_as_transformers(tiny, name, add_generation_prompt):
    from engine.entrypoints import chat_utils

    tok = transformers.AutoTokenizer.from_pretrained(tiny)
    template = TEMPLATES[name] or chat_utils.load_template(tiny)
    want = tok.apply_chat_template(MESSAGES, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt)
    got = chat_utils.render(template, MESSAGES, add_generation_prompt=add_generation_prompt,
                            tokens=chat_utils.special_tokens(tiny), tools=None, documents=None)
    assert got == want


def test_chat_template_errors_are_clear(tiny):
    from engine.entrypoints import chat_utils

    with pytest.raises(chat_utils.ChatTemplateError, match="refused these messages: system first"):
        chat_utils.render(TEMPLATES["features"], MESSAGES[1:])
    with pytest.raises(chat_utils.ChatTemplateError, match="does not parse"):
        chat_utils.render("{% for %}", MESSAGES)
    with pytest.raises(chat_utils.ChatTemplateError, match="no such file"):
        chat_utils.load_template(tiny, "/nonexistent/template.jinja")
    cfg = json.loads((tiny / "tokenizer_config.json").read_text())
    assert chat_utils.load_template(tiny) == cfg["chat_template"]


def test_tiny_model_loads_in_transformers_and_refuses_a_used_folder(tiny, tmp_path):
    import torch

    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams
    from engine.tiny_model import make_tiny_model

    llm = LLM(model=tiny, dtype="float32", block_size=32, num_kv_blocks=8, max_model_len=256,
              bind_threads=False)
    ids = llm.get_tokenizer().encode("Hello there, ünïcode!").ids
    assert llm.get_tokenizer().decode(ids) == "Hello there, ünïcode!"  # byte-level: any text
    out = llm.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True))[0].outputs[0].token_ids
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    x = torch.tensor([ids])  # the mask is explicit: <|begin_of_text|> is id 0, not padding
    ref = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=8, min_new_tokens=8,
                      do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    assert out == ref
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(ValueError, match="is not an empty folder"):
        make_tiny_model(tmp_path / "used")
    assert not (tmp_path / "used.partial").exists()


def _fake_hub_cache(root: Path, repo_id: str, source: Path) -> None:
    """huggingface_hub's cache layout: models--org--name/{refs/main, snapshots/<rev>/}."""
    base = root / ("models--" + repo_id.replace("/", "--"))
    rev = "0" * 40
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(rev)
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in source.iterdir():
        (snap / f.name).symlink_to(f)


def test_model_by_hub_id_from_cache_offline(tiny, tmp_path, monkeypatch):
    from engine.model_source import resolve_model

    _fake_hub_cache(tmp_path / "hub", "someone/tiny-llama", tiny)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    path = resolve_model("someone/tiny-llama")
    assert (path / "config.json").is_file() and path.name == "0" * 40
    with pytest.raises(ValueError, match="'someone/absent'.*not in the Hugging Face cache.*"
                       "HF_HUB_OFFLINE=1"):
        resolve_model("someone/absent")
    with pytest.raises(ValueError, match="'/no/such/dir' is not a folder"):
        resolve_model("/no/such/dir")


def test_cli_reports_a_missing_model_in_one_line(capsys, tmp_path, monkeypatch):
    from engine.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    assert main(["serve", "nobody/nothing", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'nobody/nothing'" in err and "Traceback" not in err


def test_cli_refuses_a_bad_stream_interval_before_loading(capsys, monkeypatch):
    import engine.core.async_llm
    import engine.core.engine_core
    import engine.model_source
    from engine.cli import main

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the flag was checked")

    # the server starts the core process (start_engine) once it found the model
    monkeypatch.setattr(engine.model_source, "resolve_model", no_load)
    monkeypatch.setattr(engine.core.async_llm, "start_engine", no_load)
    monkeypatch.setattr(engine.core.engine_core, "EngineCore", no_load)
    assert main(["serve", "some/model", "--stream-interval", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--stream-interval must be 'auto'" in err, err


def test_help_does_not_import_the_server_stack():
    code = ("import sys; from engine.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('fastapi', 'uvicorn', 'openai', 'transformers', "
            "'engine.core.engine_core', 'engine.entrypoints.llm') if m in sys.modules]\n"
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert "serve" in out.stdout and "make-tiny-model" in out.stdout
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


# ---- the live loop ---------------------------------------------------------------


class StepGate:
    """Paces an in-thread engine core (tests/helpers.py's async_llm_in_process):
    each step waits for a permit (allow()), until open() lets it run free;
    steps records each step's thread and outputs (request id, new token ids)."""

    def __init__(self, core):
        import threading

        self.sem, self.free = threading.Semaphore(0), threading.Event()
        self.steps: list[tuple[int, list[tuple[str, list[int]]]]] = []
        step = core.step

        def gated():
            while not self.free.is_set() and not self.sem.acquire(timeout=0.01):
                pass
            out = step()
            self.steps.append((threading.get_ident(),
                               [(o.request_id, list(o.new_token_ids)) for o in out.outputs]))
            return out

        core.step = gated  # the core's thread calls it only once a request came

    def allow(self, n: int = 1) -> None:
        for _ in range(n):
            self.sem.release()

    def open(self) -> None:
        self.free.set()


def _offline(core, prompts, params, tokenizer) -> list[list[int]]:
    """Each prompt's output ids, from the core stepped here (before its thread starts)."""
    from engine.core.messages import EngineCoreRequest

    got: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        core.add_request(EngineCoreRequest(f"off-{i}", tokenizer.encode(p).ids, params))
        got[f"off-{i}"] = []
    while core.has_unfinished():
        for o in core.step().outputs:
            got[o.request_id] += o.new_token_ids
    return [got[f"off-{i}"] for i in range(len(prompts))]


def test_requests_join_leave_and_abort_between_steps(tiny):
    from engine.core.engine_core import EngineCore
    from engine.core.input_processor import load_tokenizer
    from engine.core.messages import EngineCoreRequest
    from engine.core.sequence import RequestStatus
    from engine.sampling_params import SamplingParams

    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False)
    ids = load_tokenizer(core.path).encode
    p = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    core.add_request(EngineCoreRequest("a", ids("one two three").ids, p))
    a = core.requests["a"]
    assert [o.request_id for o in core.step().outputs] == ["a"]
    core.step()
    core.add_request(EngineCoreRequest("b", ids("four five").ids, SamplingParams(
        temperature=0, max_tokens=3, ignore_eos=True)))  # joins while a runs
    b = core.requests["b"]
    # chunked prefill: b's prefill joins a's decode in one step
    assert [o.request_id for o in core.step().outputs] == ["a", "b"]
    assert {o.request_id for o in core.step().outputs} == {"a", "b"}
    last = {o.request_id: o for o in core.step().outputs}
    assert last["b"].finish_reason == "length" and last["a"].finish_reason is None
    assert b.finish_reason == "length" and b.num_output_tokens == 3
    assert b.status == RequestStatus.FINISHED_LENGTH_CAPPED and "b" not in core.requests
    assert [s.request_id for s in core.scheduler.running] == ["a"]  # b left
    used = core.blocks.num_blocks - core.blocks.num_free
    assert used == len(a.block_table) > 0
    core.abort_requests(["a"])
    assert core.blocks.num_free == core.blocks.num_blocks
    assert not core.has_unfinished() and a.finish_reason == "abort" and not core.requests
    core.add_request(EngineCoreRequest("c", ids("x").ids, p))
    with pytest.raises(ValueError, match="already running"):
        core.add_request(EngineCoreRequest("c", ids("y").ids, p))


def test_async_llm_closing_a_stream_aborts_it(tiny):
    from helpers import async_llm_in_process

    from engine.core.sequence import RequestStatus
    from engine.sampling_params import SamplingParams

    llm = async_llm_in_process(tiny, block_size=32, num_kv_blocks=16, max_model_len=256)
    core = llm.core
    gate = StepGate(core)  # one step per permit: the core cannot finish it meanwhile

    async def run():
        reader = asyncio.ensure_future(llm.run())
        try:
            state = await llm.make_request("one two", SamplingParams(
                temperature=0, max_tokens=200, ignore_eos=True))
            gen = llm.generate(state)
            got = []
            for _ in range(3):
                gate.allow()
                got.append(await asyncio.wait_for(gen.__anext__(), 30))
            in_core = core.requests[state.request_id]
            await gen.aclose()  # the caller went away
            assert llm.num_requests() == 0
            if llm._abort_task is not None:
                await llm._abort_task  # the abort is on its way to the core
            gate.open()
            short = await llm.make_request("one two", SamplingParams(
                temperature=0, max_tokens=4, ignore_eos=True))
            tail = [u async for u in llm.generate(short)]
            for _ in range(500):
                if not core.has_unfinished():
                    break
                await asyncio.sleep(0.01)
        finally:
            gate.open()
            llm.shutdown()
        await asyncio.wait_for(reader, 30)
        return in_core, got, tail

    in_core, got, tail = asyncio.run(run())
    assert all(len(u.new_token_ids) == 1 for u in got)
    assert in_core.status == RequestStatus.FINISHED_ABORTED and in_core.finish_reason == "abort"
    assert in_core.num_output_tokens < 200
    tail_ids = [t for u in tail for t in u.new_token_ids]
    # the same prompt, greedy: the aborted request's first tokens
    assert len(tail_ids) == 4 and tail_ids[:3] == [t for u in got for t in u.new_token_ids]
    assert [u.finish_reason for u in tail] == [None] * (len(tail) - 1) + ["length"]
    assert core.blocks.num_free == core.blocks.num_blocks and not core.has_unfinished()
    assert not core.requests


def _byte_level_tokenizer():
    """A byte-level BPE whose tokens split multi-byte characters, as GPT-2's do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["héllo wörld, 日本語のテキスト and plain words", "naïve café ünïcode 🙂 emoji"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


@pytest.mark.parametrize("stop", [(), ("zq no such stop",)], ids=["no-stop", "stop-held-back"])
@pytest.mark.parametrize("tokenizer", ["byte-level", "tiny"])
def test_streamed_text_adds_up_to_the_full_decode(tiny, tokenizer, stop):
    """The front end decodes each token incrementally (its OutputProcessor, one
    detokenizer per request); what it streams, joined, is the whole output
    decoded at once, and no piece ends in half a character; a stop string that
    never matches holds the stream's tail back only until the end."""
    from hypothesis import assume, given, settings
    from hypothesis import strategies as st
    from tokenizers import Tokenizer

    from engine.core.detokenizer import output_text
    from engine.core.messages import EngineCoreOutput
    from engine.core.output_processor import OutputProcessor, RequestState
    from engine.sampling_params import SamplingParams

    tok = (_byte_level_tokenizer() if tokenizer == "byte-level"
           else Tokenizer.from_file(str(tiny / "tokenizer.json")))

    ids_of = st.lists(st.integers(0, tok.get_vocab_size() - 1), min_size=1, max_size=40)
    # prompts: any ids (most of a byte-level vocabulary's draws break a character,
    # and are skipped below), and text's own ids, which never do: drawn alone, the
    # skipped ones failed Hypothesis's filter health check now and then
    chars = "héllo wörld, 日本語のテキスト and plain naïve café ünïcode 🙂"
    prompts = st.one_of(ids_of, st.text(st.sampled_from(chars), min_size=1, max_size=30)
                        .map(lambda t: tok.encode(t).ids[:40]).filter(bool))

    class Updates(list):  # the reader's queue
        put_nowait = list.append

    @settings(max_examples=100, deadline=None)
    @given(prompts, ids_of)
    def check(prompt, ids):
        # a prompt of ids that ends inside a character: its broken tail is the prompt's
        assume("\ufffd" not in tok.decode(prompt))
        state = RequestState("r", None, prompt, SamplingParams(max_tokens=64, stop=list(stop)),
                             0, tok)
        state.queue = updates = Updates()
        out = OutputProcessor()
        out.add(state)
        for i in ids[:-1]:
            assert out.process_outputs([EngineCoreOutput("r", [i])]) == []
        assert out.process_outputs([EngineCoreOutput("r", [ids[-1]], finish_reason="length")]) \
            == []
        pieces = [u.text for u in updates]
        assert len(updates) == len(ids) and [u.new_token_ids for u in updates] == \
            [[i] for i in ids]
        whole = output_text(tok, prompt, ids)
        # bytes at the end that make no character yet are held back, as upstream's
        # detokenizer holds them, not written as U+FFFD each
        assert whole.startswith(state.text) and set(whole[len(state.text):]) <= {"\ufffd"}
        assert state.finish_reason == "length"
        assert updates[-1].finish_reason == "length" and not out.has_unfinished()
        assert "".join(pieces) == state.text  # nothing streamed is ever taken back
        if not stop:  # each piece is what the decode stream gave: never half a character
            assert not any(p.endswith("\ufffd") for p in pieces[:-1])
        # (held back for a stop string, a cut may fall after a replacement
        # character the output keeps for good: an invalid byte, as in `whole`)
        full, before = tok.decode(prompt + ids), tok.decode(prompt)
        if len(prompt) <= 4 and full.startswith(before):  # the whole prompt is the context
            assert whole == full[len(before):]

    check()


def test_async_llm_two_readers_get_the_offline_tokens_stepped_off_the_loop(tiny):
    """The server's arrangement: the core steps in a thread (in `engine serve`,
    a process) of its own, never in the event loop's thread; two readers get
    the offline core's tokens, each step's token in an update of its own
    (stream_interval 1) as soon as it is out; shutdown() ends run() and the
    core's loop."""
    import threading

    from helpers import async_llm_in_process

    from engine.core.engine_core import EngineCore
    from engine.core.input_processor import load_tokenizer
    from engine.sampling_params import SamplingParams

    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = ["one two", "three"]
    want = _offline(core, prompts, params, load_tokenizer(core.path))
    gate = StepGate(core)
    llm = async_llm_in_process(tiny, core=core)

    async def both():
        reader = asyncio.ensure_future(llm.run())
        try:
            states = [await llm.make_request(p, params) for p in prompts]
            got: list[list[list[int]]] = [[], []]

            async def read(i):
                async for u in llm.generate(states[i]):
                    got[i].append(u.new_token_ids)

            readers = [asyncio.ensure_future(read(i)) for i in range(2)]
            while not all(r.done() for r in readers):
                n = len(gate.steps)
                gate.allow()  # one step, and each of its tokens reaches its reader
                while len(gate.steps) == n:
                    await asyncio.sleep(0.001)
                out = {rid: ids for _, step in gate.steps for rid, ids in step}
                for i, s in enumerate(states):
                    heard = sum(len(ids) for _, step in gate.steps for rid, ids in step
                                if rid == s.request_id)
                    while sum(map(len, got[i])) < heard:
                        await asyncio.sleep(0.001)
                assert out  # every step gave a token
            await asyncio.gather(*readers)
        finally:
            gate.open()
            llm.shutdown()
        await asyncio.wait_for(reader, 30)
        return got, threading.get_ident()

    got, loop_thread = asyncio.run(asyncio.wait_for(both(), 60))
    assert [[t for u in g for t in u] for g in got] == want
    assert [[len(u) for u in g] for g in got] == [[1] * 6] * 2
    threads = {t for t, _ in gate.steps}
    assert len(threads) == 1 and loop_thread not in threads
    assert not llm.client.core.thread.is_alive()  # shutdown() stopped the core's loop


def test_serve_freezes_the_start_up_heap_while_serving(tiny, monkeypatch):
    """A full collection walked the whole start-up heap (torch, the model,
    FastAPI: ~380k objects, ~0.25 s here) and stalled every stream; the server
    freezes it once loaded, as upstream's EngineCore does, and gives it back."""
    import gc

    import uvicorn

    from engine.cli import main

    seen = {}

    class Server:  # uvicorn's part, without a socket
        def __init__(self, config):
            self.started, self.should_exit, self.force_exit = True, False, False

        async def serve(self, sockets=None):
            seen["frozen"] = gc.get_freeze_count()
            seen["young"] = len(gc.get_objects(generation=2))

    monkeypatch.setattr(uvicorn, "Server", Server)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    assert main(["serve", str(tiny), "--max-model-len", "256"]) == 0
    assert seen["frozen"] > 10_000, seen  # the loaded heap, torch's modules included
    assert seen["young"] < 1_000, seen    # the oldest generation left nearly empty
    assert gc.get_freeze_count() == 0


def test_async_llm_merges_the_steps_of_one_hand_off(tiny):
    """stream_interval=3: a reader gets its first token at once, then one
    update per three steps holding their tokens in order, then the end; the
    tokens equal the offline core's."""
    from helpers import async_llm_in_process

    from engine.core.engine_core import EngineCore
    from engine.core.input_processor import load_tokenizer
    from engine.sampling_params import SamplingParams

    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    (want,) = _offline(core, ["one two"], params, load_tokenizer(core.path))
    gate = StepGate(core)
    llm = async_llm_in_process(tiny, core=core)
    llm.output.stream_interval = 3  # as AsyncLLM(stream_interval=3), `--stream-interval 3`

    async def read():
        run = asyncio.ensure_future(llm.run())
        got = []
        try:
            gen = llm.generate(await llm.make_request("one two", params))
            for steps in (1, 3, 3, 1):  # the core steps no further than allowed
                gate.allow(steps)
                got.append(await asyncio.wait_for(gen.__anext__(), 30))
            assert len(gate.steps) == 8
        finally:
            gate.open()
            llm.shutdown()
        await asyncio.wait_for(run, 30)
        return got

    got = asyncio.run(asyncio.wait_for(read(), 60))
    assert [len(u.new_token_ids) for u in got] == [1, 3, 3, 1]  # the 8th ends it: at once
    assert [t for u in got for t in u.new_token_ids] == want
    assert [u.finish_reason for u in got] == [None, None, None, "length"]


def test_api_server_runs_on_uvloop_where_installed(monkeypatch):
    """uvloop (a requirement on Linux) runs the API server's loop, as `vllm
    serve`; without it, asyncio's own."""
    import uvloop

    from engine.entrypoints.openai import serve

    assert serve._runner() is uvloop.run
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now raises ImportError
    assert serve._runner() is asyncio.run
