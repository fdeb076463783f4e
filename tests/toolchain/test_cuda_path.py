"""The CUDA path's device-independent parts, checked on the CPU: the loader
reading into a parameter that is not in host memory, the KV cache sized from
the GPU's memory (not VLLM_CPU_KVCACHE_SPACE), and tools.gpu_check's greedy
stage run end to end on the cpu device."""
from __future__ import annotations

import pytest
import torch
import engine
from engine import engine_args
from engine.model_executor import model_loader
from engine.platforms import CudaPlatform

GiB = 1 << 30


def test_loader_reads_into_a_tensor_off_the_host(tmp_path):
    """A parameter on another device (here meta, which like cuda has no
    .numpy()) of the file's own dtype goes through a host buffer."""
    from safetensors.torch import save_file

    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    save_file({"w": w}, str(tmp_path / "m.safetensors"))
    path = tmp_path / "m.safetensors"
    with open(path, "rb", buffering=0) as f:
        header = model_loader._header(f, path.name, path.stat().st_size)
        model_loader._read_into(f, path.name, "w", header["w"],
                                torch.empty(3, 4, device="meta"))
        host = torch.empty(3, 4)  # and a host parameter still gets the bytes directly
        model_loader._read_into(f, path.name, "w", header["w"], host)
    assert torch.equal(host, w)


def test_gpu_kv_cache_is_what_the_utilization_leaves():
    total = 80 * GiB
    assert engine_args.gpu_kv_cache_bytes(total, total, 0.9, 16 * GiB) == int(total * 0.9) - 16 * GiB
    # another process holds 20 GiB: it counts against this engine's share
    assert engine_args.gpu_kv_cache_bytes(60 * GiB, total, 0.9, 16 * GiB) == \
        int(total * 0.9) - 20 * GiB - 16 * GiB
    with pytest.raises(ValueError, match="raise gpu_memory_utilization"):
        engine_args.gpu_kv_cache_bytes(20 * GiB, total, 0.9, 16 * GiB)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        engine_args.gpu_kv_cache_bytes(total, total, 1.5, 0)


def _config_only(folder):
    """A model folder with a config and a stand-in weights file of 1 MiB
    (bfloat16, so 2 MiB once in float32): all that sizing the cache reads."""
    import json

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "torch_dtype": "bfloat16"}))
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(1 << 20)
    return folder


def test_cuda_kv_cache_comes_from_gpu_memory(tmp_path, monkeypatch):
    path = _config_only(tmp_path / "m")
    seen = []

    def mem_get_info(device):
        seen.append(device)
        return 3 * GiB, 4 * GiB

    monkeypatch.setattr(engine_args, "current_platform", CudaPlatform)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    # far beyond the host's memory: on CUDA it is not what sizes the cache
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "100000")
    cfg = engine_args.create_engine_config(path, "float32", block_size=32,
                                           gpu_memory_utilization=0.5)
    weights = engine_args.checkpoint_bytes(path, cfg.model, torch.float32)
    assert weights == 2 << 20
    per_block = engine_args.kv_cache_bytes_per_block(cfg.model, 32, torch.float32)
    assert seen and seen[0].type == "cuda"
    assert cfg.num_blocks == (2 * GiB - 1 * GiB - weights) // per_block
    with pytest.raises(ValueError, match="no GPU memory is left"):
        engine_args.create_engine_config(path, "float32", gpu_memory_utilization=0.2)


@pytest.mark.slow  # two checkpoints, each through the engine and transformers.generate
@pytest.mark.skipif(not engine.BUILD_INFO.has_kernels, reason="no compiled kernels (run ci/setup-dev.sh)")
def test_gpu_check_greedy_stage_runs_on_the_cpu(tmp_path):
    from tools.gpu_check import greedy

    lines = []
    assert greedy.run("cpu", tmp_path, log=lines.append) == []
    assert len(lines) == 2 * len(greedy.PROMPTS) and all(x.startswith("ok") for x in lines)
