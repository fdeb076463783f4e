"""Pipeline parallel (-pp): the layers split in stages, each rank loading
only its own; hidden states sent between stages over gloo; greedy ids of two
stages equal one rank's."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.config import ModelConfig
from engine.distributed import parallel_state
from engine.distributed.parallel_state import pp_layer_range
from engine.model_executor.layers.parallel import check_stages, stage_holds
from helpers import make_checkpoint

REPO = Path(__file__).resolve().parents[2]
# the last two share 18 tokens: the second takes a part of the first's block (its rows copied
# on each rank) when the prompts run again
PROMPTS = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13], [1, 20], [1] + list(range(30, 47)) + [5],
           [1] + list(range(30, 47)) + [8, 9]]
SCRIPT = """
import json, sys
from engine import LLM, SamplingParams
llm = LLM(sys.argv[1], "float32", pipeline_parallel_size=int(sys.argv[2]), num_kv_blocks=16,
          max_model_len=256, max_num_batched_tokens=int(sys.argv[3]) or None,
          max_num_seqs=int(sys.argv[3]) or 256)
print("workers", len(getattr(llm.core.executor, "procs", {})))
greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
outs = [llm.generate(json.loads(sys.argv[4]), greedy) for _ in range(2)]
print(json.dumps([[o.outputs[0].token_ids for o in call] for call in outs]))
"""


def run_engine(model: Path, pp: int, budget: int = 0) -> list:
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "VLLM_CPU_OMP_THREADS_BIND": "0|1" if pp == 2 else "0"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(pp), str(budget),
                          json.dumps(PROMPTS)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == f"workers {pp - 1}"  # the stages after the first: processes of their own
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    # three layers: stage 0 takes two, stage 1 one
    return make_checkpoint(tmp_path_factory.mktemp("pp") / "m", "llama", layers=3)


@pytest.mark.slow
def test_pp2_greedy_ids_equal_one_rank(model):
    one = run_engine(model, 1)
    assert one[0] and all(one[0]) and one[1] == one[0]  # again: parts of blocks copied
    assert run_engine(model, 2) == one
    # 3 tokens a step: prompts prefilled in chunks, some steps sample nothing
    assert run_engine(model, 2, budget=3) == one


def test_layers_split_as_evenly_as_they_go():
    assert [pp_layer_range(3, 2, s) for s in range(2)] == [(0, 2), (2, 3)]
    assert [pp_layer_range(4, 2, s) for s in range(2)] == [(0, 2), (2, 4)]
    assert [pp_layer_range(5, 3, s) for s in range(3)] == [(0, 2), (2, 4), (4, 5)]


def _config(layers=3, tied=False) -> ModelConfig:
    return ModelConfig("llama", 105, 64, 128, layers, 4, 2, 16, 1e-6, 1e4, 512, tied, False,
                       False, (2,), None, "LlamaForCausalLM")


def test_bad_stage_counts_are_one_line():
    check_stages(_config(), 3)
    with pytest.raises(ValueError, match="more than the model's 3 layers"):
        check_stages(_config(), 4)
    with pytest.raises(ValueError, match="a whole number >= 1"):
        check_stages(_config(), 0)
    from engine.engine_args import parallel_backend

    assert parallel_backend(_config(), 1, None, 2) == "mp"
    with pytest.raises(ValueError, match="not combined yet"):
        parallel_backend(_config(), 2, None, 2)
    opt = dataclasses.replace(_config(), architecture="OPTForCausalLM")
    with pytest.raises(ValueError, match="not OPTForCausalLM; use pipeline_parallel_size 1"):
        parallel_backend(opt, 1, "mp", 2)


@pytest.fixture
def stage(monkeypatch):
    def take(rank: int, size: int = 2) -> None:
        monkeypatch.setattr(parallel_state, "_pp_rank", rank)
        monkeypatch.setattr(parallel_state, "_pp_size", size)
    return take


def test_each_stage_reads_only_its_tensors(stage):
    stage(0)
    assert stage_holds(_config(), "model.layers.1.mlp.down_proj.weight")
    assert not stage_holds(_config(), "model.layers.2.mlp.down_proj.weight")
    assert stage_holds(_config(), "model.embed_tokens.weight")
    assert not stage_holds(_config(), "lm_head.weight")
    stage(1)
    assert stage_holds(_config(), "model.layers.2.self_attn.q_proj.weight_scale")
    assert not stage_holds(_config(), "model.layers.0.input_layernorm.weight")
    assert not stage_holds(_config(), "model.embed_tokens.weight")
    assert stage_holds(_config(tied=True), "model.embed_tokens.weight")  # the tied LM head
    assert stage_holds(_config(), "model.norm.weight")


def test_a_stage_loads_only_its_layers(stage, model):
    from engine.model_executor.model_loader import load_weights
    from engine.model_executor.models.llama import LlamaForCausalLM

    c = ModelConfig.from_dir(model)
    stage(1)
    last = LlamaForCausalLM(c, torch.float32)
    load_weights(last, model)  # strict: a tensor of this stage missing would raise
    assert len(last.layers) == 1 and last.embed_tokens is None and last.lm_head is not None
    assert "model.layers.2.mlp.down_proj.weight" in last.checkpoint_map()
    assert not any(k.startswith(("model.layers.0.", "model.layers.1.", "model.embed"))
                   for k in last.checkpoint_map())
    stage(0)
    first = LlamaForCausalLM(c, torch.float32)
    load_weights(first, model)
    assert len(first.layers) == 2 and first.norm is None and first.lm_head is None
    stage(0, 1)
    whole = LlamaForCausalLM(c, torch.float32)
    load_weights(whole, model)
    assert torch.equal(whole.layers[2].down.weight, last.layers[0].down.weight)
