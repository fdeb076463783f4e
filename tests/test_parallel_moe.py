"""Tensor parallel over the mixture-of-experts families: every expert's
intermediate columns split across the ranks (routed and shared ones), the
router whole on each; greedy ids of two ranks equal one rank's."""
from __future__ import annotations

import json

import pytest
from arch_checkpoints import make_arch_checkpoint
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
