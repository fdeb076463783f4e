"""Tensor parallel (-tp) on this machine: greedy ids of two ranks equal one
rank's (GQA with split KV heads and one replicated KV head), offline and
through `engine serve`; a killed rank stops the engine with one line naming
it; the per-rank CPU binding and the model's split are checked up front."""
from __future__ import annotations

import dataclasses

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import urllib.request
import pytest

from engine import envs
from engine.config import ModelConfig
from engine.model_executor.layers.parallel import check_shardable, checkpoint_slice, vocab_range
from engine.platforms import cpu_binding
from helpers import assert_dies_with_503, http_status, make_checkpoint

REPO = Path(__file__).resolve().parents[2]
# the last two share 18 tokens: the second takes a part of the first's block (its rows copied
# on each rank) when the prompts run again
PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13], [1, 20], [1] + list(range(30, 47)) + [5],
           [1] + list(range(30, 47)) + [8, 9]]

# One engine in a process of its own: the driver rank pins its process, which
# must not be pytest's. Prints the greedy ids as JSON, or the error line.
SCRIPT = """
import json, os, signal, sys
from engine import LLM, SamplingParams
llm = LLM(sys.argv[1], "float32", tensor_parallel_size=int(sys.argv[2]), num_kv_blocks=16,
          max_model_len=256)
if sys.argv[3] == "kill":
    os.kill(llm.core.executor.procs[1].pid, signal.SIGKILL)
greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
try:
    outs = [llm.generate(json.loads(sys.argv[4]), greedy) for _ in range(2)]
except RuntimeError as exc:
    print("ERROR", exc)
else:
    print(json.dumps([[o.outputs[0].token_ids for o in call] for call in outs]))
"""


def run_engine(model: Path, tp: int, mode: str = "run", bind: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "VLLM_CPU_OMP_THREADS_BIND": bind or ("0|1" if tp == 2 else "0")}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(tp), mode,
                          json.dumps(PROMPTS)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module", params=[2, 1], ids=["kv2-split", "kv1-replicated"])
def model(request, tmp_path_factory) -> Path:
    # vocab 105: not a multiple of 2, so the last rank's vocabulary rows are padded
    return make_checkpoint(tmp_path_factory.mktemp("tp") / "m", "llama", heads=4,
                           kv_heads=request.param)


@pytest.mark.slow
def test_tp2_greedy_ids_equal_one_rank(model):
    one = run_engine(model, 1)
    first, again = json.loads(one)
    assert first[0] and again == first  # again: parts of blocks found, copied
    before = set(Path("/dev/shm").glob("vllm-engine-allreduce-*"))
    assert run_engine(model, 2) == one
    # the ranks' shared buffers: a random name (not the port's), unlinked once mapped
    assert set(Path("/dev/shm").glob("vllm-engine-allreduce-*")) <= before


@pytest.mark.slow
def test_killed_rank_stops_the_engine_with_its_name(tmp_path):
    model = make_checkpoint(tmp_path / "m", "llama", heads=4, kv_heads=2)
    t0 = time.monotonic()
    line = run_engine(model, 2, "kill")
    assert line.startswith("ERROR tensor-parallel rank 1 died"), line
    assert time.monotonic() - t0 < 300  # bounded by run_engine's timeout: no hang


def test_binding_lists_must_match_the_world_size():
    env = {"VLLM_CPU_OMP_THREADS_BIND": "0|1|2"}
    with pytest.raises(envs.EnvError, match=r"names 3 CPU list\(s\) but there are 2 ranks"):
        cpu_binding.plan_all(2, env, {0, 1, 2})
    with pytest.raises(envs.EnvError, match="ranks share CPUs"):
        cpu_binding.plan_all(2, {"VLLM_CPU_OMP_THREADS_BIND": "0-1|1"}, {0, 1})
    with pytest.raises(envs.EnvError, match=r"not allowed to this process: 1 \(allowed: 0;"):
        cpu_binding.plan_all(2, {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, {0})
    plans = cpu_binding.plan_all(2, {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, {0, 1})
    assert [b.cpus for b in plans] == [(0,), (1,)]


def _config(heads=4, kv=2, inter=128, vocab=105) -> ModelConfig:
    return ModelConfig("llama", vocab, 64, inter, 2, heads, kv, 16, 1e-6, 1e4, 512, False, False,
                       False, (2,), None, "LlamaForCausalLM")


def test_model_must_split_over_the_ranks():
    check_shardable(_config(), 2)
    check_shardable(_config(kv=1), 4)  # one KV head, replicated on 4 ranks
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        check_shardable(_config(), 3)
    with pytest.raises(ValueError, match="6 KV heads: one must divide the other"):
        check_shardable(_config(heads=12, kv=6), 4)
    with pytest.raises(ValueError, match="intermediate_size 130"):
        check_shardable(_config(inter=130), 4)


def test_each_rank_gets_its_slices(monkeypatch):
    from engine.distributed import parallel_state

    monkeypatch.setattr(parallel_state, "_world", 4)
    monkeypatch.setattr(parallel_state, "_rank", 3)
    c = _config(kv=2)
    assert vocab_range(105) == (81, 105, 27)
    assert checkpoint_slice(c, "lm_head.weight") == (0, 81, 105)
    assert checkpoint_slice(c, "model.layers.1.self_attn.q_proj.weight") == (0, 48, 64)
    assert checkpoint_slice(c, "model.layers.1.self_attn.k_proj.weight") == (0, 16, 32)  # head 1
    assert checkpoint_slice(c, "model.layers.0.self_attn.o_proj.weight") == (1, 48, 64)
    assert checkpoint_slice(c, "model.layers.0.mlp.down_proj.weight") == (1, 96, 128)
    assert checkpoint_slice(c, "model.layers.0.input_layernorm.weight") is None
    monkeypatch.setattr(parallel_state, "_rank", 1)  # KV head 0 serves ranks 0 and 1
    assert checkpoint_slice(c, "model.layers.1.self_attn.v_proj.weight") == (0, 0, 16)


def test_bad_parallel_args_are_one_line(tmp_path):
    from engine.engine_args import parallel_backend

    with pytest.raises(ValueError, match="distributed_executor_backend 'nccl' is not supported"):
        parallel_backend(_config(), 2, "nccl")
    phi3 = dataclasses.replace(_config(), architecture="Phi3ForCausalLM")  # fused qkv_proj
    with pytest.raises(ValueError, match="so far, not Phi3ForCausalLM; use tensor_parallel_size 1"):
        parallel_backend(phi3, 2, "mp")
    assert parallel_backend(phi3, 1, None) is None
    with pytest.raises(ValueError, match="'uni' runs one rank"):
        parallel_backend(_config(), 2, "uni")
    assert parallel_backend(_config(), 2, None) == "mp"
    assert parallel_backend(_config(), 1, "mp") is None


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def _spawned(pid: int) -> list[int]:
    """pid's children that multiprocessing spawned (not its resource tracker)."""
    return [p for p in _children(pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]


@pytest.mark.slow
def test_serve_tp2_answers_like_one_rank_and_a_killed_rank_is_503(tmp_path):
    from engine.distributed.parallel_state import free_port

    model = make_checkpoint(tmp_path / "m", "llama", heads=4, kv_heads=1)
    want = json.loads(run_engine(model, 1))[0][0]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_OMP_THREADS_BIND": "0|1",
           "VLLM_CPU_KVCACHE_SPACE": "0.05"}
    log = open(tmp_path / "server.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", str(model), "--port",
                             str(port), "--dtype", "float32", "--max-model-len", "256", "-tp", "2"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            if http_status(url + "/health") == 200:
                break
            time.sleep(0.3)
        r = _post(url + "/v1/completions", {
            "model": str(model), "prompt": PROMPTS[0], "max_tokens": 12, "temperature": 0,
            "ignore_eos": True})
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        prompt = PROMPTS[0]  # token ids: the text joins the prompt's, separator kept
        text = tok.decode(prompt + want)[len(tok.decode(prompt)):]
        assert r["choices"][0]["text"] == text
        # the ranks are the engine core process's: rank 0 is the core, rank 1 its child
        (core,) = _spawned(proc.pid)
        (rank1,) = _spawned(core)
        os.kill(rank1, signal.SIGKILL)
        assert_dies_with_503(proc, url, tmp_path / "server.log", "tensor-parallel rank 1 died")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_shared_all_reduce_buffer_has_a_name_no_one_can_guess(monkeypatch, tmp_path):
    """Named after the group's port, another local user could plant a file or a
    link there first; rank 0 makes a random name and sends it to the others."""
    import torch.distributed as td

    from engine.distributed import parallel_state as ps
    from engine.distributed import shm_all_reduce

    made = []

    class Recorder:
        def __init__(self, path, rank, world, timeout, create):
            made.append(path)
            open(path, "x").close()

    monkeypatch.setattr(shm_all_reduce, "supported", lambda: True)
    monkeypatch.setattr(shm_all_reduce, "ShmAllReduce", Recorder)
    monkeypatch.setattr(td, "barrier", lambda: None)
    monkeypatch.setattr(td, "broadcast_object_list", lambda objs, src: None)
    dist = ps.DistInit("127.0.0.1", 29500, world_size=2, same_machine=True)
    for _ in range(2):
        ps._join_shared_memory(0, dist)
    assert len(set(made)) == 2 and not any("29500" in p for p in made), made
    assert not any(Path(p).exists() for p in made)  # unlinked once mapped
    monkeypatch.setattr(ps, "_shm", None)
