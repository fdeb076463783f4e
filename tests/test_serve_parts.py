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
    import engine.core.engine_core
    from engine.cli import main

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the flag was checked")

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


def test_requests_join_leave_and_abort_between_steps(tiny):
    from engine.core.engine_core import EngineCore
    from engine.sampling_params import SamplingParams

    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False)
    p = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    a = core.make_sequence("a", "one two three", p)
    core.add(a)
    core.step()
    core.step()
    b = core.make_sequence("b", "four five", SamplingParams(temperature=0, max_tokens=3,
                                                            ignore_eos=True))
    core.add(b)  # joins while a runs
    # chunked prefill: b's prefill joins a's decode in one step
    assert [s.request_id for s in core.step()] == ["a", "b"]
    assert {s.request_id for s in core.step()} == {"a", "b"}
    core.step()
    assert b.finish_reason == "length" and b.num_output_tokens == 3
    assert [s.request_id for s in core.scheduler.running] == ["a"]  # b left
    used = core.blocks.num_blocks - core.blocks.num_free
    assert used == len(a.block_table) > 0
    assert core.abort("a") and core.blocks.num_free == core.blocks.num_blocks
    assert not core.has_unfinished() and a.finish_reason == "abort"
    c = core.make_sequence("c", "x", p)
    core.add(c)
    with pytest.raises(ValueError, match="already running"):
        core.add(core.make_sequence("c", "y", p))


def test_async_llm_closing_a_stream_aborts_it(tiny):
    from engine.core.async_llm import AsyncLLM
    from engine.core.engine_core import EngineCore
    from engine.sampling_params import SamplingParams

    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False)
    llm = AsyncLLM(core)

    async def run():
        steps = asyncio.ensure_future(llm.run())
        seq = llm.make_sequence("one two", SamplingParams(temperature=0, max_tokens=200,
                                                          ignore_eos=True))
        gen = llm.generate(seq)
        got = [await gen.__anext__() for _ in range(3)]
        await gen.aclose()  # the caller went away
        short = llm.make_sequence("one two", SamplingParams(temperature=0, max_tokens=4,
                                                            ignore_eos=True))
        tail = [u async for u in llm.generate(short)]
        llm.shutdown()
        await asyncio.wait_for(steps, 30)
        return seq, got, tail

    seq, got, tail = asyncio.run(run())
    assert all(len(u.new_token_ids) == 1 for u in got)
    assert seq.finish_reason == "abort" and seq.num_output_tokens < 200
    assert [u.finish_reason for u in tail] == [None, None, None, "length"]
    assert core.blocks.num_free == core.blocks.num_blocks and not core.has_unfinished()


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


@pytest.mark.parametrize("tokenizer", ["byte-level", "tiny"])
def test_streamed_text_adds_up_to_the_full_decode(tiny, tokenizer):
    """The server decodes each token incrementally; what it streams, joined, is
    the whole output decoded at once, and no piece ends in half a character."""
    from hypothesis import assume, given, settings
    from hypothesis import strategies as st
    from tokenizers import Tokenizer

    from engine.core.async_llm import RequestUpdate
    from engine.entrypoints.openai.serving_engine import StreamedText as _Text
    from engine.sampling_params import SamplingParams

    tok = (_byte_level_tokenizer() if tokenizer == "byte-level"
           else Tokenizer.from_file(str(tiny / "tokenizer.json")))
    from engine.core.detokenizer import output_text

    ids_of = st.lists(st.integers(0, tok.get_vocab_size() - 1), min_size=1, max_size=40)

    @settings(max_examples=100, deadline=None)
    @given(ids_of, ids_of)
    def check(prompt, ids):
        # a prompt of ids that ends inside a character: its broken tail is the prompt's
        assume("\ufffd" not in tok.decode(prompt))
        seq = type("Seq", (), {"params": SamplingParams(max_tokens=64), "token_ids": prompt,
                               "num_prompt_tokens": len(prompt)})()
        text = _Text(tok, seq)
        pieces = [text.add(RequestUpdate([i])) for i in ids[:-1]]
        whole = output_text(tok, prompt, ids)
        pieces.append(text.add(RequestUpdate([ids[-1]], "length", whole)))
        assert "".join(pieces) == whole
        assert not any(p.endswith("\ufffd") for p in pieces[:-1])
        full, before = tok.decode(prompt + ids), tok.decode(prompt)
        if len(prompt) <= 4 and full.startswith(before):  # the whole prompt is the context
            assert whole == full[len(before):]

    check()


def test_async_llm_steps_in_the_loop_and_hands_each_token_over_before_the_next_step(tiny):
    """The server's arrangement: the core steps in the event loop's own thread
    (AsyncLLM.run), two readers get the offline core's tokens, each token
    reaches its reader before the next step starts, and shutdown() ends run()."""
    import threading

    from engine.core.async_llm import AsyncLLM
    from engine.core.engine_core import EngineCore
    from engine.sampling_params import SamplingParams

    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = [core.make_sequence(f"off-{i}", p, params) for i, p in enumerate(["one two", "three"])]
    for seq in want:
        core.add(seq)
    while core.has_unfinished():
        core.step()
    llm = AsyncLLM(core)
    steps: list[int] = []  # the thread of each step
    step = core.step

    def counted():
        steps.append(threading.get_ident())
        return step()

    core.step = counted

    async def read(prompt):
        ids, seen = [], []
        async for u in llm.generate(llm.make_sequence(prompt, params)):
            ids += u.new_token_ids
            seen.append(len(steps))  # steps begun when this token arrived
        return ids, seen

    async def both():
        run = asyncio.ensure_future(llm.run())
        got = await asyncio.wait_for(asyncio.gather(read("one two"), read("three")), 60)
        llm.shutdown()
        await asyncio.wait_for(run, 30)
        return got

    got = asyncio.run(both())
    assert [ids for ids, _ in got] == [s.output_token_ids for s in want]
    # both joined at the first step: their n-th token came from step n, read before step n+1
    assert [seen for _, seen in got] == [list(range(1, 7))] * 2
    assert set(steps) == {threading.get_ident()}


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
    from engine.core.async_llm import AsyncLLM
    from engine.core.engine_core import EngineCore
    from engine.sampling_params import SamplingParams

    core = EngineCore(tiny, "float32", block_size=32, num_kv_blocks=16, max_model_len=256,
                      bind_threads=False)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = core.make_sequence("off", "one two", params)
    core.add(want)
    while core.has_unfinished():
        core.step()
    llm = AsyncLLM(core, stream_interval=3)

    async def read():
        run = asyncio.ensure_future(llm.run())
        got = [u async for u in llm.generate(llm.make_sequence("one two", params))]
        llm.shutdown()
        await asyncio.wait_for(run, 30)
        return got

    got = asyncio.run(asyncio.wait_for(read(), 60))
    assert [len(u.new_token_ids) for u in got] == [1, 3, 3, 1]  # the 8th ends it: at once
    assert [t for u in got for t in u.new_token_ids] == want.output_token_ids
    assert [u.finish_reason for u in got] == [None, None, None, "length"]
