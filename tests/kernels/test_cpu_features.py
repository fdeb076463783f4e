"""CPU detection is data, the decisions are pure: kernel code path and linear
layers per dtype, on the CPUs machines of this kind are seen with (an AMD EPYC
with AVX2 only, a Xeon with AVX-512 and AMX), an AVX-NE-CONVERT client part
and an ARM server, all as fake /proc/cpuinfo trees."""
from __future__ import annotations

import subprocess
import sys

import pytest

from engine import envs
from engine.platforms import cpu_features as cf

EPYC_AVX2 = "fpu sse sse2 avx avx2 fma f16c bmi2"
XEON_AMX = EPYC_AVX2 + " avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16 amx_tile avx_vnni"
CLIENT_NE = EPYC_AVX2 + " avx_vnni avx_ne_convert"
ZEN4 = EPYC_AVX2 + " avx512f avx512bw avx512vl avx512dq avx512_bf16 avx512_vnni"  # no AMX
TORCH = cf.TorchLinearSupport(reorder_op=True, dtypes=frozenset({"float32", "bfloat16"}))


def features(flags: str, arch="x86_64", cap=None) -> cf.CpuFeatures:
    return cf.CpuFeatures(arch, cf.cap_flags(flags.split(), cap), cap)


def fake_root(tmp_path, text: str):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(text)
    return tmp_path


def test_probe_reads_flags_and_applies_the_cap(tmp_path):
    root = fake_root(tmp_path, f"processor\t: 0\nflags\t\t: {XEON_AMX}\n\nprocessor\t: 1\n")
    full = cf.probe(root, env={}, arch="x86_64")
    assert full.usable_isas() == ["avx512_bf16", "avx512", "avx2", "generic"]
    assert full.capped_at is None
    capped = cf.probe(root, env={"VLLM_CPU_MAX_ISA": "avx2"}, arch="x86_64")
    assert capped.usable_isas() == ["avx2", "generic"] and capped.capped_at == "avx2"
    assert not any(f.startswith(("avx512", "amx", "avx_vnni")) for f in capped.flags)
    assert "avx2" in capped.flags and "fma" in capped.flags
    generic = cf.probe(root, env={"VLLM_CPU_MAX_ISA": "generic"}, arch="x86_64")
    assert generic.usable_isas() == ["generic"]
    skylake = cf.probe(root, env={"VLLM_CPU_MAX_ISA": "avx512"}, arch="x86_64")
    assert skylake.usable_isas() == ["avx512", "avx2", "generic"]
    assert skylake.capped_at == "avx512" and "avx512_bf16" not in skylake.flags
    assert not any(f.startswith(("amx", "avx512_fp16")) for f in skylake.flags)
    assert {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx_vnni"} <= skylake.flags


def test_probe_reads_arm_features_and_survives_no_cpuinfo(tmp_path):
    root = fake_root(tmp_path, "processor\t: 0\nFeatures\t: fp asimd asimddp bf16 sve\n")
    arm = cf.probe(root, env={}, arch="aarch64")
    assert "bf16" in arm.flags and arm.usable_isas() == ["neon_bf16", "neon", "generic"]
    # neon_bf16 is built +dotprod (GGUF's int8): BF16 without it runs neon
    (tmp_path / "nodp").mkdir()
    no_dp = cf.probe(fake_root(tmp_path / "nodp", "Features\t: fp asimd bf16\n"), env={},
                     arch="aarch64")
    assert no_dp.usable_isas() == ["neon", "generic"]
    assert cf.probe(tmp_path / "nothing", env={}, arch="x86_64").flags == frozenset()


def test_bad_max_isa_is_one_line():
    with pytest.raises(envs.EnvError, match="VLLM_CPU_MAX_ISA='sse'.*avx512, avx2, generic"):
        envs.cpu_max_isa({"VLLM_CPU_MAX_ISA": "sse"})
    assert envs.cpu_max_isa({}) is None


@pytest.mark.parametrize("flags,cap,expected", [
    (XEON_AMX, None, "avx512_bf16"),
    (ZEN4, None, "avx512_bf16"),
    (ZEN4, "avx512", "avx512"),       # a Skylake-SP: AVX-512 without AVX512_BF16
    (XEON_AMX, "avx2", "avx2"),
    (EPYC_AVX2, None, "avx2"),
    (CLIENT_NE, None, "avx2"),
])
def test_auto_picks_the_best_usable_compiled_path(flags, cap, expected):
    compiled = ["avx2", "avx512", "avx512_bf16"]
    assert cf.choose_isa("auto", features(flags, cap=cap), compiled) == expected


def test_auto_respects_what_was_compiled():
    assert cf.choose_isa("auto", features(XEON_AMX), ["avx2"]) == "avx2"  # VLLM_CPU_DISABLE_AVX512
    assert cf.choose_isa("auto", features(ZEN4), ["avx2", "avx512"]) == "avx512"
    assert cf.choose_isa("auto", features("fp asimd", arch="aarch64"), ["generic"]) == "generic"


def test_requests_this_cpu_cannot_run_name_what_it_can():
    with pytest.raises(cf.CpuIsaError) as e:
        cf.choose_isa("avx512", features(EPYC_AVX2), ["avx2", "avx512"])
    msg = str(e.value)
    assert "VLLM_CPU_ISA=avx512 needs" in msg and "supports: avx2" in msg
    assert "one of: avx2" in msg and "\n" not in msg
    with pytest.raises(cf.CpuIsaError, match="avx512_bf16 needs avx512_bf16, which this CPU "
                                             "lacks; .*supports: avx512, avx2"):
        cf.choose_isa("avx512_bf16", features(ZEN4, cap="avx512"), ["avx2", "avx512", "avx512_bf16"])
    with pytest.raises(cf.CpuIsaError, match="not compiled into this build; it has: avx2"):
        cf.choose_isa("avx512", features(XEON_AMX), ["avx2"])
    with pytest.raises(cf.CpuIsaError, match="needs AVX2 and FMA at least"):
        cf.choose_isa("auto", features("fpu sse sse2 avx"), ["avx2", "avx512"])
    # CpuIsaError is an ImportError too: `import engine` refuses with it
    assert issubclass(cf.CpuIsaError, ImportError) and issubclass(cf.CpuIsaError, envs.EnvError)


@pytest.mark.parametrize("flags,cap,dtype,mode", [
    (EPYC_AVX2, None, "float32", cf.PREPACKED),
    (EPYC_AVX2, None, "bfloat16", cf.PLAIN),       # the CPU that crashed bf16 generation
    (XEON_AMX, None, "bfloat16", cf.PREPACKED),
    (XEON_AMX, "avx2", "bfloat16", cf.PLAIN),      # the cap makes it behave like the EPYC
    (CLIENT_NE, None, "bfloat16", cf.PREPACKED),   # avx_ne_convert is enough for oneDNN
    (XEON_AMX, None, "float16", cf.PLAIN),         # no avx512_fp16 / amx_fp16
])
def test_linear_choice_per_cpu_and_dtype(flags, cap, dtype, mode):
    choice = cf.choose_linear(dtype, features(flags, cap=cap), TORCH)
    assert choice.mode == mode, choice.reason
    if cap and mode == cf.PLAIN:
        assert "VLLM_CPU_MAX_ISA=avx2" in choice.reason


@pytest.mark.parametrize("flags,cap,dtype,mode", [
    (EPYC_AVX2, None, "float32", cf.PANELS),
    (EPYC_AVX2, None, "bfloat16", cf.PANELS),      # bf16 on AVX2 runs the engine's kernel
    (XEON_AMX, None, "float32", cf.PANELS),
    (XEON_AMX, None, "bfloat16", cf.PANELS),       # AMX: oneDNN's tiles from 8 rows (large M)
    (XEON_AMX, "avx2", "bfloat16", cf.PANELS),
    (CLIENT_NE, None, "bfloat16", cf.PANELS),
    (XEON_AMX, None, "float16", cf.PLAIN),         # the panel kernel has no float16
    (ZEN4, None, "bfloat16", cf.PANELS),           # in k pairs, AVX512_BF16 dot products
    (ZEN4, "avx512", "bfloat16", cf.PANELS),       # k-major, converted to float
    (XEON_AMX, "avx512", "bfloat16", cf.PANELS),   # AMX hidden by the cap
])
def test_linear_choice_with_the_panel_kernel(flags, cap, dtype, mode):
    choice = cf.choose_linear(dtype, features(flags, cap=cap), TORCH, panels=True)
    assert choice.mode == mode, choice.reason


def test_the_reason_names_the_pair_kernel_only_where_it_runs():
    zen = features(ZEN4)
    assert "AVX512_BF16" in cf.choose_linear("bfloat16", zen, TORCH, True, bf16_pairs=True).reason
    assert "AVX512_BF16" not in cf.choose_linear("bfloat16", zen, TORCH, True).reason
    assert "AVX512_BF16" not in cf.choose_linear("float32", zen, TORCH, True,
                                                 bf16_pairs=True).reason


def test_vllm_cpu_linear_insists_or_refuses_in_one_line():
    amx = features(XEON_AMX)
    for requested, mode in cf.LINEAR_MODES.items():
        assert cf.choose_linear("float32", amx, TORCH, True, requested).mode == mode
    assert cf.choose_linear("bfloat16", amx, TORCH, True, "panels").mode == cf.PANELS
    with pytest.raises(cf.CpuIsaError, match="VLLM_CPU_LINEAR=panels: .* does not run float16"):
        cf.choose_linear("float16", amx, TORCH, True, "panels")
    with pytest.raises(cf.CpuIsaError, match="VLLM_CPU_LINEAR=panels"):
        cf.choose_linear("float32", amx, TORCH, False, "panels")  # e.g. the NEON path
    with pytest.raises(cf.CpuIsaError, match="VLLM_CPU_LINEAR=onednn: oneDNN's bfloat16 path"):
        cf.choose_linear("bfloat16", features(EPYC_AVX2), TORCH, True, "onednn")
    with pytest.raises(envs.EnvError, match="VLLM_CPU_LINEAR='fast' is not valid; use one of: "
                                            "auto, panels, onednn, plain"):
        envs.cpu_linear({"VLLM_CPU_LINEAR": "fast"})
    with pytest.raises(envs.EnvError, match="VLLM_ZENTORCH_WEIGHT_PREPACK='yes' is not valid"):
        envs.zentorch_weight_prepack({"VLLM_ZENTORCH_WEIGHT_PREPACK": "yes"})
    assert envs.zentorch_weight_prepack({}) and not envs.zentorch_weight_prepack(
        {"VLLM_ZENTORCH_WEIGHT_PREPACK": "0"})


def test_linear_choice_follows_what_torch_supports():
    no_bf16 = cf.TorchLinearSupport(reorder_op=True, dtypes=frozenset({"float32"}))
    assert cf.choose_linear("bfloat16", features(XEON_AMX), no_bf16).mode == cf.PLAIN
    none = cf.TorchLinearSupport(reorder_op=False, dtypes=frozenset())
    assert cf.choose_linear("float32", features(XEON_AMX), none).mode == cf.PLAIN


def test_detected_torch_support_matches_torch():
    import torch

    support = cf.TorchLinearSupport.detect()
    assert support.reorder_op == hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    assert ("bfloat16" in support.dtypes) == (
        support.reorder_op and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.parametrize("env,needle", [
    ({"VLLM_CPU_ISA": "avx9"}, "VLLM_CPU_ISA='avx9' is not valid; use one of: auto, avx512_bf16, avx512"),
    ({"VLLM_CPU_ISA": "avx512", "VLLM_CPU_MAX_ISA": "avx2"}, "VLLM_CPU_ISA=avx512 needs"),
    ({"VLLM_CPU_MAX_ISA": "sse"}, "VLLM_CPU_MAX_ISA='sse' is not valid"),
])
def test_engine_env_refuses_bad_isa_values_in_one_line(env, needle):
    import os

    res = subprocess.run([sys.executable, "-m", "engine.cli", "env"], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and needle in res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1


def test_engine_env_shows_the_linear_choice_and_cap():
    import json
    import os

    res = subprocess.run([sys.executable, "-m", "engine.cli", "env", "--json"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "VLLM_CPU_MAX_ISA": "avx2"})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["cpu_max_isa"] == "avx2" and data["cpu_isa_in_use"] == "avx2"
    # bfloat16 without AVX-512/AMX: the engine's panel kernel where this build has
    # it (x86), torch's F.linear otherwise
    from engine import ops

    want = cf.PANELS if ops.has_panel_linear() else cf.PLAIN
    assert data["linear_bfloat16"].split()[0] == want and "kv_cache" in data


def test_arm_paths():
    graviton3 = features("fp asimd evtstrm aes sha2 crc32 asimddp bf16 sve", arch="aarch64")
    graviton2 = features("fp asimd evtstrm aes sha2 crc32 asimddp", arch="aarch64")
    altra = features("fp asimd evtstrm aes crc32", arch="aarch64")
    compiled = ["neon_bf16", "neon", "generic"]
    assert cf.choose_isa("auto", graviton3, compiled) == "neon_bf16"
    assert cf.choose_isa("auto", altra, compiled) == "neon"
    assert cf.choose_isa("auto", graviton2, compiled) == "neon"  # dot products, no BF16
    with pytest.raises(cf.CpuIsaError, match="VLLM_CPU_ISA=neon_bf16 needs asimddp/bf16"):
        cf.choose_isa("neon_bf16", altra, compiled)
    with pytest.raises(cf.CpuIsaError, match="not compiled into this build"):
        cf.choose_isa("avx2", altra, compiled)
    assert not features(XEON_AMX).supports("neon")
