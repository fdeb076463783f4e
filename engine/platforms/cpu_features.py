"""What this CPU can run, and the decisions that follow from it.

Detection is data (`probe` reads the processor's flags once, capped by
VLLM_CPU_MAX_ISA so that an AVX-512 machine can behave exactly like an
AVX2-only one); the decisions are pure functions of that data: which compiled
kernel path runs (`choose_isa`) and how each linear layer runs for a dtype
(`choose_linear`). Tests build `CpuFeatures` values directly.
"""
from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine import envs

# Flags each compiled x86 code path needs (what csrc/cpu/isa.cpp checks too).
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
ISA_FLAGS: dict[str, frozenset[str]] = {
    # AVX-512 with AVX512_BF16: bfloat16 rounding and dot products in one instruction
    "avx512_bf16": _AVX512 | {"avx512_bf16"},
    "avx512": _AVX512,
    "avx2": frozenset({"avx2", "fma"}),
    # AArch64 BF16 extension (FEAT_BF16) and dot products (FEAT_DotProd: GGUF's int8)
    "neon_bf16": frozenset({"bf16", "asimddp"}),
    "neon": frozenset(),                # Advanced SIMD is part of every ARMv8-A CPU
    "generic": frozenset(),
}
X86_ISAS = ("avx512_bf16", "avx512", "avx2")
ARM_ISAS = ("neon_bf16", "neon")
# Best first: `auto` takes the first one that is compiled in and usable.
ISA_ORDER = ("avx512_bf16", "avx512", "avx2", "neon_bf16", "neon", "generic")

# Flags above each cap level: removed from the probe when VLLM_CPU_MAX_ISA caps it.
_ABOVE_AVX512 = ("avx512_bf16", "avx512_fp16", "amx", "avx_ne_convert", "avx10")
_ABOVE_AVX2 = ("avx512", "amx", "avx_vnni", "avx_ne_convert", "avx_ifma", "avx10")
_ABOVE_GENERIC = _ABOVE_AVX2 + ("avx", "fma", "f16c")
_ABOVE = {"avx512": _ABOVE_AVX512, "avx2": _ABOVE_AVX2, "generic": _ABOVE_GENERIC}


#: AMX as the kernels use it: tiles with int8 (W8A8) and bfloat16 (attention) dot products
AMX_FLAGS = frozenset({"amx_tile", "amx_int8", "amx_bf16"})


def has_amx(features: CpuFeatures) -> bool:
    return features.flags >= AMX_FLAGS


@dataclass(frozen=True)
class CpuFeatures:
    arch: str                      # platform.machine(): x86_64, aarch64, ...
    flags: frozenset[str]          # /proc/cpuinfo "flags" (x86) or "Features" (ARM)
    capped_at: str | None = None   # VLLM_CPU_MAX_ISA when it removed flags

    def supports(self, isa: str) -> bool:
        if isa == "generic":
            return True
        family = X86_ISAS if self.arch in ("x86_64", "AMD64") else (
            ARM_ISAS if self.arch in ("aarch64", "arm64") else ())
        return isa in family and ISA_FLAGS[isa] <= self.flags

    def usable_isas(self) -> list[str]:
        return [isa for isa in ISA_ORDER if self.supports(isa)]


def cap_flags(flags: Iterable[str], cap: str | None) -> frozenset[str]:
    """Drop every flag above `cap` (avx512, avx2 or generic); `None` keeps them all."""
    if cap is None:
        return frozenset(flags)
    return frozenset(f for f in flags if not f.startswith(_ABOVE[cap]))


def read_flags(root: Path) -> frozenset[str]:
    """The first processor's feature flags from <root>/proc/cpuinfo (empty if unreadable)."""
    try:
        text = (root / "proc" / "cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def probe(root: Path | None = None, env: Mapping[str, str] | None = None,
          arch: str | None = None) -> CpuFeatures:
    root = Path(envs.sysfs_root(env)) if root is None else root
    cap = envs.cpu_max_isa(env)
    flags = read_flags(root)
    capped = cap_flags(flags, cap)
    return CpuFeatures(arch or platform.machine(), capped, cap if capped != flags else None)


@lru_cache(maxsize=1)
def current() -> CpuFeatures:
    return probe()


class CpuIsaError(envs.EnvError, ImportError):
    """VLLM_CPU_ISA names a code path that is not compiled in or that this CPU cannot run."""


def describe(features: CpuFeatures) -> str:
    usable = [i for i in features.usable_isas()
              if not (i == "generic" and features.arch in ("x86_64", "AMD64"))]
    capped = f" (capped by VLLM_CPU_MAX_ISA={features.capped_at})" if features.capped_at else ""
    return f"this {features.arch} CPU supports: {', '.join(usable)}{capped}"


def choose_isa(requested: str, features: CpuFeatures, compiled: Iterable[str]) -> str:
    """The compiled code path to run for VLLM_CPU_ISA=`requested`; raises CpuIsaError."""
    compiled = [c for c in ISA_ORDER if c in set(compiled)]
    if not compiled:
        raise CpuIsaError("this build of vllm-engine has no CPU kernels")
    if requested == "auto":
        for isa in compiled:
            if features.supports(isa):
                return isa
        raise CpuIsaError(
            f"none of the compiled CPU code paths ({', '.join(compiled)}) runs here; "
            f"{describe(features)}. The x86 build needs AVX2 and FMA at least; on an older "
            "processor build with VLLM_TARGET_DEVICE=empty")
    if requested not in compiled:
        raise CpuIsaError(
            f"VLLM_CPU_ISA={requested} is not compiled into this build; it has: "
            f"{', '.join(compiled)} (or auto)")
    if not features.supports(requested):
        need = "/".join(sorted(ISA_FLAGS[requested] - features.flags))  # what is missing
        runnable = [c for c in compiled if features.supports(c)]
        raise CpuIsaError(
            f"VLLM_CPU_ISA={requested} needs {need}, which this CPU lacks; {describe(features)}."
            f" Set VLLM_CPU_ISA to auto or one of: {', '.join(runnable) or 'none'}")
    return requested


# --- linear layers ---------------------------------------------------------

PREPACKED = "onednn-prepacked"
PANELS = "engine-panels"
PLAIN = "plain"
#: VLLM_CPU_LINEAR's values (engine/envs.py) to the modes they insist on
LINEAR_MODES = {"panels": PANELS, "onednn": PREPACKED, "plain": PLAIN}

# What torch's oneDNN path needs per reduced-precision dtype (mirrors torch's
# mkldnn_bf16_device_check / mkldnn_fp16_device_check on x86).
_ONEDNN_DTYPE_FLAGS = {
    "bfloat16": (frozenset({"avx512bw", "avx512vl", "avx512dq"}), frozenset({"avx_ne_convert"}),
                 frozenset({"amx_bf16"})),
    "float16": (frozenset({"avx512_fp16"}), frozenset({"avx_ne_convert"}),
                frozenset({"amx_fp16"})),
}


@dataclass(frozen=True)
class TorchLinearSupport:
    """What the installed torch offers for prepacked linear layers."""
    reorder_op: bool                  # torch.ops.mkldnn._reorder_linear_weight exists
    dtypes: frozenset[str]            # dtypes torch's own oneDNN check accepts here

    @classmethod
    def detect(cls) -> TorchLinearSupport:
        import torch

        mk = torch.ops.mkldnn
        ok = torch.backends.mkldnn.is_available() and hasattr(mk, "_reorder_linear_weight")
        dtypes = {"float32"} if ok else set()
        if ok and getattr(mk, "_is_mkldnn_bf16_supported", lambda: False)():
            dtypes.add("bfloat16")
        if ok and getattr(mk, "_is_mkldnn_fp16_supported", lambda: False)():
            dtypes.add("float16")
        return cls(ok, frozenset(dtypes))


@dataclass(frozen=True)
class LinearChoice:
    mode: str      # PANELS, PREPACKED or PLAIN
    reason: str


def choose_linear(dtype: str, features: CpuFeatures, torch_support: TorchLinearSupport,
                  panels: bool = False, requested: str = "auto",
                  bf16_pairs: bool = False) -> LinearChoice:
    """How linear layers of `dtype` run on this CPU. `panels`: the kernel code
    path in use has the engine's panel kernel (float32 and bfloat16);
    `bf16_pairs`: it multiplies bfloat16 in k pairs with AVX512_BF16
    (engine.ops.panel_k_pack), which the reason then says.

    Measured on the benchmark's 435M-parameter Llama (benchmarks/kernels.py
    --linear): the panel kernel streams the weight at decode faster than
    oneDNN's prepacked weights. With AMX, oneDNN's bfloat16 path computes
    several times faster once a step has more than a few rows: choose_large_m
    sends those steps to it (LARGE_M_ROWS_AMX)."""
    onednn = _onednn_choice(dtype, features, torch_support)
    has_panels = panels and dtype in ("float32", "bfloat16")
    dot = ("; it multiplies bfloat16 in k pairs with AVX512_BF16 dot products"
           if dtype == "bfloat16" and bf16_pairs else "")
    if requested != "auto":
        mode = LINEAR_MODES[requested]
        if mode == PANELS and not has_panels:
            raise CpuIsaError(f"VLLM_CPU_LINEAR=panels: the engine's panel kernel does not run "
                              f"{dtype} on this code path (x86 AVX2/AVX-512, float32 and "
                              "bfloat16 only); use auto, onednn or plain")
        if mode == PREPACKED and onednn.mode != PREPACKED:
            raise CpuIsaError(f"VLLM_CPU_LINEAR=onednn: {onednn.reason}; use auto, panels "
                              "or plain")
        return LinearChoice(mode, f"VLLM_CPU_LINEAR={requested}"
                                  + (f": the engine's panel kernel{dot}" if mode == PANELS else ""))
    if not has_panels:
        return onednn
    return LinearChoice(PANELS, f"the engine's panel kernel streams {dtype} weights at "
                                f"decode faster than oneDNN or F.linear{dot}")


def _onednn_choice(dtype: str, features: CpuFeatures, torch_support: TorchLinearSupport
                   ) -> LinearChoice:
    """Prepacked oneDNN where torch and the (possibly capped) CPU support it
    for that dtype, plain F.linear otherwise."""
    if not torch_support.reorder_op:
        return LinearChoice(PLAIN, "this torch has no oneDNN weight prepacking")
    if dtype == "float32":
        return LinearChoice(PREPACKED, "oneDNN prepacks float32 weights on every x86-64 CPU")
    needs = _ONEDNN_DTYPE_FLAGS.get(dtype)
    if needs is None:
        return LinearChoice(PLAIN, f"no prepacked path for {dtype}")
    alternatives = " or ".join("+".join(sorted(s)) for s in needs)
    if not any(s <= features.flags for s in needs):
        capped = (f" (VLLM_CPU_MAX_ISA={features.capped_at} hides them)"
                  if features.capped_at else "")
        return LinearChoice(PLAIN, f"oneDNN's {dtype} path needs {alternatives}, which this "
                                   f"CPU lacks{capped}")
    if dtype not in torch_support.dtypes:
        return LinearChoice(PLAIN, f"this torch's oneDNN refuses {dtype} on this CPU")
    have = next(s for s in needs if s <= features.flags)
    return LinearChoice(PREPACKED, f"the CPU has {'+'.join(sorted(have))} for oneDNN's "
                                   f"{dtype} path")


# --- large batches (prefill) -----------------------------------------------

#: Rows (tokens of a step) from which oneDNN's prepacked GEMM beats the engine's
#: panel kernel, per code path and dtype. Measured with 2 threads on the
#: benchmark Llamas' MLP shapes (K x N = 512 x 2752 and 2048 x 10912) on an AMD
#: EPYC with AVX-512 and AVX512_BF16 (no AMX), the cores shared with other work,
#: so the figures are coarse (GFLOP/s, panels / oneDNN): float32 M=512 21/32 and
#: 53/35, M=1500 33/47 and 27/41; bfloat16 M=512 25/46 and 77/84, M=1500 46/67
#: and 79/86; at M <= 256 the panels win or tie on the large shape. The avx2
#: panels (same machine, VLLM_CPU_ISA=avx2; oneDNN there still used AVX-512),
#: float32: M=128 6/12 and 24/36, M=512 15/32 and 20/33. bfloat16 on AVX2 has no
#: oneDNN path (F.linear would run), so it keeps the panels for every M. On AMX
#: CPUs bfloat16 runs oneDNN for every M already (choose_linear).
#: With AVX512_BF16 (AMD Zen 4, no AMX), re-measured on a quiet 2-core EPYC on
#: SmolLM-135M's four GEMMs (K x N = 576 x 960, 576 x 576, 576 x 3072, 1536 x
#: 576) over its 30 layers, ms panels / oneDNN: float32 M=64 73/78, M=128
#: 128/129, M=256 251/248, M=500 490/479; bfloat16 M=64 36/38, M=128 70/69,
#: M=256 131/128, M=500 250/248: the crossover is 256 rows.
LARGE_M_ROWS = {
    ("avx512_bf16", "float32"): 256, ("avx512_bf16", "bfloat16"): 256,
    ("avx512", "float32"): 512, ("avx512", "bfloat16"): 512,
    ("avx2", "float32"): 128,
}
#: The same where the CPU has AMX tiles (Intel Xeon from Sapphire Rapids), whose
#: oneDNN float32 GEMMs are ahead sooner. Measured on a quiet 2-core Sapphire
#: Rapids, the small Llama's shapes (K x N = 512 x 1536, 512 x 512, 512 x 2752,
#: 1376 x 512), GMAC/s panels / oneDNN: M=128 161/166, 147/165, 168/161,
#: 155/173; M=256 166/174, 150/172, 170/168, 159/181; a 500-token prefill
#: 113 -> 106-107 ms (benchmarks/prefill.py, the same run's vLLM 108 ms).
#: bfloat16 there: oneDNN's AMX tiles from 8 rows; below, the panels stream the
#: weight faster (SmolLM-135M's 30 layers, GB/s 27-40 against 19-23 at one
#: row; a step's layers 6.7 / 7.1 / 7.4 / 10.5 / 20.5 ms against 9.8 / 10.5 /
#: 10.0 / 10.0 / 11.1 ms at 1 / 2 / 4 / 8 / 16 rows).
LARGE_M_ROWS_AMX = {("avx512_bf16", "float32"): 128, ("avx512_bf16", "bfloat16"): 8}


@dataclass(frozen=True)
class LargeMChoice:
    rows: int | None   # from this many rows the second path runs; None: panels always
    mode: str          # PREPACKED or PLAIN: how those large batches run
    reason: str


def choose_large_m(dtype: str, isa: str | None, linear: LinearChoice,
                   torch_support: TorchLinearSupport, features: CpuFeatures,
                   requested: int | None = None) -> LargeMChoice:
    """Where layers run the panel kernel (`linear.mode == PANELS`), from how many
    rows a step's GEMM goes to oneDNN (prepacked: a second copy of the weight)
    or F.linear instead. `requested`: VLLM_CPU_LINEAR_LARGE_M (None: auto)."""
    if linear.mode != PANELS:
        return LargeMChoice(None, linear.mode, f"{linear.mode} runs every batch size")
    onednn = _onednn_choice(dtype, features, torch_support)
    mode = PREPACKED if onednn.mode == PREPACKED else PLAIN
    how = "oneDNN (prepacked)" if mode == PREPACKED else "F.linear"
    if requested == 0:
        return LargeMChoice(None, PANELS, "VLLM_CPU_LINEAR_LARGE_M=0: the panel kernel for "
                                          "every batch, no second weight copy")
    if requested is not None:
        return LargeMChoice(requested, mode, f"VLLM_CPU_LINEAR_LARGE_M={requested}: {how} "
                                             f"from {requested} rows (a second weight copy)")
    key = (isa or "", dtype)
    rows = LARGE_M_ROWS_AMX.get(key) if "amx_tile" in features.flags else None
    rows = rows or LARGE_M_ROWS.get(key)
    if rows is None:
        return LargeMChoice(None, PANELS, f"no crossover measured for {isa} {dtype}")
    return LargeMChoice(rows, mode, f"{how} from {rows} rows, as measured for {isa} {dtype} "
                                    "(a second weight copy; VLLM_CPU_LINEAR_LARGE_M=0 saves it)")

