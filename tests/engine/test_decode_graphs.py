"""Decode steps replayed from captured graphs (engine/worker/decode_graphs.py,
cpu_graph.py, csrc/step_graph.cpp): the replay's logits are the eager step's
bit for bit as the inputs change step to step, a step that reads a value back
is left eager, and greedy ids through the engine equal --enforce-eager's."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import make_checkpoint

from engine import LLM, SamplingParams
from engine.core.kv_cache_manager import BlockManager
from engine.engine_args import create_engine_config
from engine.forward_context import ForwardContext, set_context
from engine.model_executor.layers.quantization.rtn import quantize
from engine.tiny_model import make_tiny_model
from engine.worker import cpu_graph
from engine.worker.cpu_worker import build_runner
from engine.worker.decode_graphs import MAX_CAPTURE_SIZE


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    llama = make_checkpoint(root / "llama", "llama", seed=5, hidden=128, inter=256)
    return {"llama": llama, "w4a16": quantize(llama, root / "w4a16", scheme="w4a16"),
            "gemma2": make_tiny_model(root / "gemma2", arch="gemma2")}


def _runner(path, dtype="float32", **kw):
    cfg = create_engine_config(path, dtype, max_model_len=512, bind_threads=False, **kw)
    return build_runner(cfg, BlockManager(cfg.num_blocks, cfg.block_size))


def _inputs(n: int, step: int):
    """n sequences of different lengths, one block each, at decode step `step`."""
    pos = torch.arange(n) * 7 + 3 + step
    return (torch.arange(n) * 11 + 5 + step, pos, torch.arange(n) * 128 + pos,
            torch.arange(n, dtype=torch.int32)[:, None], (pos + 1).to(torch.int32))


def _eager(runner, ids, pos, slots, tables, seq_lens):
    set_context(ForwardContext(False, slots, block_tables=tables, seq_lens=seq_lens))
    try:
        return runner.model(ids, pos, torch.arange(len(ids)))
    finally:
        set_context(None)


@pytest.mark.parametrize("name,dtype", [("llama", "float32"), ("llama", "bfloat16"),
                                        ("w4a16", "bfloat16")])
@pytest.mark.parametrize("n", [1, 3])
def test_replayed_logits_are_the_eager_steps_bit_for_bit(models, name, dtype, n):
    runner = _runner(models[name], dtype)
    graphs = runner.decode_graphs
    assert graphs is not None
    with torch.inference_mode():
        for step in range(4):  # the first captures, the rest replay on new inputs
            replayed = graphs.run(*_inputs(n, step)).clone()
            assert torch.equal(replayed, _eager(runner, *_inputs(n, step))), step
    graph = graphs.graphs[n]
    # the layers' ops run from C++; Python keeps only what C++ cannot take
    assert graph.native_calls > 8 * graph.python_calls


def test_replay_without_the_cpp_graph_is_the_same(models, monkeypatch):
    """The `empty` variant has no StepGraph: every op replays from Python."""
    monkeypatch.setattr(cpu_graph, "_native_graph", lambda: None)
    runner = _runner(models["llama"])
    with torch.inference_mode():
        for step in range(3):
            replayed = runner.decode_graphs.run(*_inputs(2, step)).clone()
            assert torch.equal(replayed, _eager(runner, *_inputs(2, step)))
    assert runner.decode_graphs.graphs[2].native_calls == 0


@torch.inference_mode()  # as the runner steps: contiguous() then reaches the recorder whole
def test_an_op_that_copied_at_capture_copies_again():
    """contiguous() of a strided view is a copy: a replay must redo it (skipped
    as a view, the copy kept the first step's values)."""
    x = torch.randn(4, 6)

    def step():
        y = x.t().contiguous()  # may alias: here a copy
        z = x[:, :3].reshape(-1)  # may alias: here a copy of a strided view
        return torch.cat([y.sum(0), z]) * 2

    first, graph = cpu_graph.capture(step)
    assert isinstance(graph, cpu_graph.CapturedStep)
    before = first.clone()
    x.copy_(torch.randn(4, 6))
    replayed = graph.replay()
    assert torch.equal(replayed, step())
    assert not torch.equal(replayed, before)


@torch.inference_mode()
def test_an_op_replays_through_the_out_overload_of_its_own_types():
    """x >> shifts (a tensor) runs as __rshift__.Tensor: its out= form is
    Tensor_out, not Scalar_out, whose arguments have the same names (engine.
    reference's GGUF unpacking; the replay had failed 'IValue is not a Scalar')."""
    x = torch.randint(0, 1 << 30, (4, 8), dtype=torch.int32)
    shifts = torch.arange(8, dtype=torch.int32)

    def step():
        return ((x >> shifts) & 15) + (x > 7)

    first, graph = cpu_graph.capture(step)
    assert isinstance(graph, cpu_graph.CapturedStep), graph
    x.copy_(torch.randint(0, 1 << 30, (4, 8), dtype=torch.int32))
    assert torch.equal(graph.replay(), step())


def test_a_step_that_reads_a_value_back_is_not_captured():
    x = torch.randn(5)

    def step():
        return x * 2 if x.sum().item() > 0 else x * 3

    result, why = cpu_graph.capture(step)
    assert why == "the step reads a value back (aten._local_scalar_dense.default)"
    assert torch.equal(result, step())


def test_a_capture_does_not_import_torch_dynamo():
    """torch wraps a dispatch mode's __torch_dispatch__ in _disable_dynamo
    unless the mode opts out; the wrapper's first call imports torch._dynamo
    and sympy, seconds inside the first capture (which can fall mid-request).
    In a fresh process: this one's other tests may have imported them."""
    code = ("import sys, torch\n"
            "from engine.worker import cpu_graph\n"
            "x = torch.randn(5)\n"
            "result, why = cpu_graph.capture(lambda: x * 2)\n"
            "assert not isinstance(why, str), why\n"
            "assert torch.equal(result, x * 2) and torch.equal(why.replay(), x * 2)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch._dynamo', 'sympy'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_sliding_window_model_stays_eager_and_right(models):
    """Gemma 2's soft cap and windows read the lengths back each step."""
    runner = _runner(models["gemma2"])
    with torch.inference_mode():  # the try's step stands; the next runs eagerly
        assert torch.equal(runner.decode_graphs.run(*_inputs(2, 0)),
                           _eager(runner, *_inputs(2, 0)))
        assert runner.decode_graphs.run(*_inputs(2, 1)) is None
    assert runner.decode_graphs.refused[2].startswith("the step reads a value back")
    assert 2 not in runner.decode_graphs.graphs


def test_batches_above_the_capture_size_run_eagerly(models):
    runner = _runner(models["llama"])
    n = MAX_CAPTURE_SIZE + 1
    with torch.inference_mode():
        assert runner.decode_graphs.run(*_inputs(n, 0)) is None
    assert _runner(models["llama"], enforce_eager=True).decode_graphs is None


@pytest.mark.parametrize("name", ["llama", "w4a16"])
def test_greedy_ids_equal_enforce_eager(models, name):
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9, 10, 11, 12, 13, 14], [3]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ids = {}
    for eager in (True, False):
        llm = LLM(str(models[name]), "bfloat16", enforce_eager=eager, max_model_len=512)
        single = llm.generate(prompt_token_ids=prompts[:1], sampling_params=params)
        batch = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        ids[eager] = [o.outputs[0].token_ids for o in single + batch]
        del llm
    assert ids[True] == ids[False]


def test_the_flag_reaches_the_engine_arguments():
    import argparse

    from engine.cli import scheduler_args
    from engine.engine_args import cli_engine_args

    p = argparse.ArgumentParser()
    scheduler_args(p)
    assert cli_engine_args(p.parse_args(["--enforce-eager"]))["enforce_eager"] is True
    assert cli_engine_args(p.parse_args([]))["enforce_eager"] is False
