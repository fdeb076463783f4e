"""Parallel over the mixture-of-experts families: with -tp every expert's
intermediate columns split across the ranks (routed and shared ones), the
router whole on each; -pp stages and -dp replicas too; greedy ids equal one
rank's."""
from __future__ import annotations

import json

import pytest
from arch_checkpoints import make_arch_checkpoint
import test_parallel_dp
import test_parallel_pp
from test_parallel import run_engine

from engine.config import ModelConfig
from engine.model_executor.layers.parallel import check_shardable, checkpoint_slice


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_tp2_moe_greedy_ids_equal_one_rank(tmp_path, arch):
    model = make_arch_checkpoint(tmp_path / arch, arch)
    one = run_engine(model, 1)
    assert json.loads(one) and json.loads(one)[0]
    assert run_engine(model, 2) == one


@pytest.mark.slow
def test_pp2_and_dp2_moe_greedy_ids_equal_one_rank(tmp_path):
    # three layers (stage 0 takes two): a sparse one on each side of the split
    # and Qwen2-MoE's dense one (mlp_only_layers=[1]) inside
    model = make_arch_checkpoint(tmp_path / "q", "qwen2_moe")
    one = test_parallel_pp.run_engine(model, 1)
    assert test_parallel_pp.run_engine(model, 2) == one
    dp_one, _ = json.loads(test_parallel_dp.run_engine(model, 1))
    dp_two, _ = json.loads(test_parallel_dp.run_engine(model, 2))
    assert dp_one and dp_two == dp_one


def test_expert_slices(tmp_path, monkeypatch):
    from engine.model_executor.layers import parallel

    path = make_arch_checkpoint(tmp_path / "q", "qwen2_moe")
    c = ModelConfig.from_dir(path)
    monkeypatch.setattr(parallel, "tp_size", lambda: 2)
    monkeypatch.setattr(parallel, "tp_rank", lambda: 1)
    p = "model.layers.0.mlp."
    assert checkpoint_slice(c, p + "experts.7.gate_proj.weight") == (0, 24, 48)  # 48 // 2
    assert checkpoint_slice(c, p + "experts.0.down_proj.weight") == (1, 24, 48)
    assert checkpoint_slice(c, p + "shared_expert.up_proj.weight") == (0, 48, 96)  # 96 // 2
    assert checkpoint_slice(c, p + "shared_expert.down_proj.weight") == (1, 48, 96)
    assert checkpoint_slice(c, p + "gate.weight") is None  # the router, whole
    assert checkpoint_slice(c, p + "shared_expert_gate.weight") is None
    assert checkpoint_slice(c, "model.layers.1.mlp.up_proj.weight") == (0, 64, 128)  # dense layer


def test_experts_must_split_over_the_ranks(tmp_path):
    c = ModelConfig.from_dir(make_arch_checkpoint(tmp_path / "q", "qwen2_moe",
                                                  moe_intermediate_size=50))
    check_shardable(c, 2)
    with pytest.raises(ValueError, match="tensor_parallel_size 4 does not divide the model's "
                                         "experts' intermediate size 50"):
        check_shardable(c, 4)
