"""Every run-time environment variable of the engine, parsed and validated here.

Each variable has its default, its valid forms and its error message next to
it; the rest of the package reads the parsed values through these functions.
Build-time variables live in tools/build_settings.py.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping

CPU_ISA_CHOICES = ("auto", "avx512_bf16", "avx512", "avx2", "neon_bf16", "neon", "generic")
CPU_MAX_ISA_CHOICES = ("avx512", "avx2", "generic")
CPU_LINEAR_CHOICES = ("auto", "panels", "onednn", "plain")
PREFILL_ATTENTION_CHOICES = ("paged", "sdpa")
DEFAULT_KVCACHE_GIB = 4.0


class EnvError(ValueError):
    """An environment variable has a value the engine cannot use."""


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = env.get(name, "").strip().lower() or default
    if value not in choices:
        raise EnvError(f"{name}={env[name]!r} is not valid; use one of: {', '.join(choices)}")
    return value


def cpu_isa(env: Mapping[str, str] | None = None) -> str:
    """VLLM_CPU_ISA: which compiled CPU code path the kernels use.

    `auto` (default) takes the best one that is compiled in and that the
    processor runs; `avx512_bf16` (x86 with AVX-512 and AVX512_BF16: Zen 4,
    Cooper Lake, Sapphire Rapids), `avx512` (x86 with AVX-512 F/BW/VL/DQ), `avx2` (x86 with
    AVX2+FMA; forces that path on an AVX-512 machine, as the tests do) and
    `neon_bf16` / `neon` (AArch64 with / without the BF16
    extension), `generic` (the portable path of other builds) insist on one path and fail
    with one line where it is not compiled in or the processor lacks it.
    """
    return _choice(_env(env), "VLLM_CPU_ISA", CPU_ISA_CHOICES, "auto")


def cpu_max_isa(env: Mapping[str, str] | None = None) -> str | None:
    """VLLM_CPU_MAX_ISA: make every CPU capability probe of the engine report at
    most this level (`avx512`: AVX-512 F/BW/VL/DQ but no AVX512_BF16, AVX512_FP16,
    AMX or AVX-NE-CONVERT, a Skylake-SP; `avx2`: no AVX-512, AMX, AVX-VNNI or
    AVX-NE-CONVERT; `generic`: no AVX at all), so a newer machine behaves like
    an older one: the kernel path `auto` picks and the linear-layer decision
    (panel layout included) follow.
    Unset: the processor as it is."""
    env = _env(env)
    if not env.get("VLLM_CPU_MAX_ISA", "").strip():
        return None
    return _choice(env, "VLLM_CPU_MAX_ISA", CPU_MAX_ISA_CHOICES, "")


def cpu_linear(env: Mapping[str, str] | None = None) -> str:
    """VLLM_CPU_LINEAR: how linear layers run on the CPU. `auto` (default) lets
    the engine decide per dtype from the CPU and torch (`engine env` shows the
    decision and why); `panels` (the engine's own kernel, x86 AVX2/AVX-512:
    weights packed in 16-column panels, fastest at decode), `onednn` (torch's
    prepacked oneDNN weights) and `plain` (torch's F.linear) insist on one,
    failing with one line where it cannot run here."""
    return _choice(_env(env), "VLLM_CPU_LINEAR", CPU_LINEAR_CHOICES, "auto")


def cpu_linear_large_m(env: Mapping[str, str] | None = None) -> int | None:
    """VLLM_CPU_LINEAR_LARGE_M: from how many rows (tokens of a step) a linear
    layer that runs the engine's panel kernel switches to oneDNN's GEMM (or
    torch's F.linear), which then keeps a second copy of the weight. `auto`
    (default, or unset): the crossover measured for this CPU and dtype
    (engine.platforms.cpu_features.LARGE_M_ROWS; `engine env` shows it); a
    positive integer: that many rows; `0`: the panel kernel for every batch and
    no second copy (the least memory)."""
    return _rows_or_auto(_env(env), "VLLM_CPU_LINEAR_LARGE_M", "a positive number of rows")


def gguf_int8_max_m(env: Mapping[str, str] | None = None) -> int | None:
    """VLLM_GGUF_INT8_MAX_M: up to how many rows (tokens of a step) a GGUF
    layer quantizes x to int8 and multiplies in integer dot products, as
    llama.cpp does (engine.model_executor.layers.quantization.gguf_int8).
    `auto` (default, or unset): the crossover measured for this CPU; a number
    of rows; `0`: never (x stays float: the product equals the dequantized
    weights' to float rounding)."""
    return _rows_or_auto(_env(env), "VLLM_GGUF_INT8_MAX_M", "a number of rows")


def _rows_or_auto(env: Mapping[str, str], name: str, rows: str) -> int | None:
    """A count of rows, 0 (off) or `auto` / unset (None: the caller's measured default)."""
    raw = env.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return None
    if not raw.isdigit():
        raise EnvError(f"{name}={env[name]!r} is not valid; use auto, 0 (off) or {rows}")
    return int(raw)


def prefill_attention(env: Mapping[str, str] | None = None) -> str:
    """VLLM_PREFILL_ATTENTION: how prompts attend. `paged` (default): the
    engine's flash kernel over the paged KV cache (ops.paged_prefill_attention);
    `sdpa`: torch's scaled_dot_product_attention over each prompt's own keys,
    the engine's old path (kept to measure against: benchmarks/prefill.py)."""
    return _choice(_env(env), "VLLM_PREFILL_ATTENTION", PREFILL_ATTENTION_CHOICES, "paged")


def cpu_keep_freed_memory(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_CPU_KEEP_FREED_MEMORY: `1` (default) keeps glibc's malloc from
    returning a step's freed activations to the kernel once the model is loaded
    (engine.platforms.cpu_malloc: no page faults per step, resident memory at the
    largest step's); `0` leaves malloc as it is."""
    return _choice(_env(env), "VLLM_CPU_KEEP_FREED_MEMORY", ("0", "1"), "1") == "1"


def zentorch_weight_prepack(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_ZENTORCH_WEIGHT_PREPACK: upstream's switch for AMD Zen (the zen_cpu
    platform): `1` (default) lays linear weights out at load as VLLM_CPU_LINEAR
    decides, `0` keeps torch's plain weights (F.linear)."""
    return _choice(_env(env), "VLLM_ZENTORCH_WEIGHT_PREPACK", ("0", "1"), "1") == "1"


def allow_runtime_lora_updating(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING: upstream's switch for the
    /v1/load_lora_adapter and /v1/unload_lora_adapter routes (with --enable-lora):
    `1` or `true` (any case) serves them; unset (default) or anything else does not."""
    return _env(env).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").strip().lower() in ("1", "true")


def check_bounds(env: Mapping[str, str] | None = None) -> bool:
    """VLLM_CHECK_BOUNDS: `1` also bound-checks index tensors (slots, block tables,
    positions) on GPUs, `0` (default) only on the CPU. On a GPU each check reads
    the tensor back, synchronizing the device on every call (and breaking CUDA
    graph capture), so it is a debugging aid there; on the CPU it is a cheap scan
    and always on."""
    return _choice(_env(env), "VLLM_CHECK_BOUNDS", ("0", "1"), "0") == "1"


def kvcache_space_bytes(env: Mapping[str, str] | None = None) -> int:
    """VLLM_CPU_KVCACHE_SPACE: the paged KV cache size in GiB (a decimal number);
    unset or 0 means 4 GiB."""
    env = _env(env)
    raw = env.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    try:
        gib = float(raw) if raw else 0.0
    except ValueError:
        raise EnvError(
            f"VLLM_CPU_KVCACHE_SPACE={raw!r} is not a number of GiB (e.g. 4 or 0.5)") from None
    if gib < 0 or gib != gib or gib == float("inf"):
        raise EnvError(f"VLLM_CPU_KVCACHE_SPACE={raw!r} must be a positive number of GiB")
    return int((gib or DEFAULT_KVCACHE_GIB) * (1 << 30))


_CPU_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def parse_cpu_list(text: str, name: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    text = text.strip()
    if not _CPU_LIST.match(text):
        raise EnvError(f"{name}: {text!r} is not a CPU list like 0-31 or 0,2,4-7")
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise EnvError(f"{name}: range {part!r} runs backwards")
        cpus.extend(range(a, b + 1))
    if len(set(cpus)) != len(cpus):
        raise EnvError(f"{name}: {text!r} names a CPU twice")
    return cpus


def format_cpu_list(cpus) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> '0-3,8,10-11': the inverse of parse_cpu_list, so a
    message names 98 CPUs as '2-99', not one by one."""
    parts: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def omp_threads_bind_text(env: Mapping[str, str] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND as the user wrote it (for error messages)."""
    return _env(env).get("VLLM_CPU_OMP_THREADS_BIND", "").strip()


def omp_threads_bind(env: Mapping[str, str] | None = None) -> str | list[list[int]]:
    """VLLM_CPU_OMP_THREADS_BIND: `auto` (default), `nobind`, a CPU list
    (`0-31`), or one list per rank separated by `|` (`0-31|32-63`)."""
    raw = omp_threads_bind_text(env) or "auto"
    if raw.lower() in ("auto", "nobind"):
        return raw.lower()
    lists = [parse_cpu_list(part, "VLLM_CPU_OMP_THREADS_BIND") for part in raw.split("|")]
    seen: set[int] = set()
    for cpus in lists:
        if seen & set(cpus):
            raise EnvError(f"VLLM_CPU_OMP_THREADS_BIND={raw!r}: ranks share CPUs "
                           f"{format_cpu_list(seen & set(cpus))}")
        seen |= set(cpus)
    return lists


def num_reserved_cpus(world_size: int, env: Mapping[str, str] | None = None) -> int:
    """VLLM_CPU_NUM_OF_RESERVED_CPU: CPUs per rank kept from OpenMP (with `auto`);
    default 0 for one rank, else 1."""
    env = _env(env)
    raw = env.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "").strip()
    if not raw:
        return 0 if world_size == 1 else 1
    if not raw.isdigit():
        raise EnvError(f"VLLM_CPU_NUM_OF_RESERVED_CPU={raw!r} must be a whole number >= 0")
    return int(raw)


def visible_memory_nodes(env: Mapping[str, str] | None = None) -> list[int] | None:
    """CPU_VISIBLE_MEMORY_NODES: NUMA nodes the workers may use (with `auto`); all if unset."""
    env = _env(env)
    raw = env.get("CPU_VISIBLE_MEMORY_NODES", "").strip()
    return parse_cpu_list(raw, "CPU_VISIBLE_MEMORY_NODES") if raw else None


def sysfs_root(env: Mapping[str, str] | None = None) -> str:
    """VLLM_SYSFS_ROOT: where /sys and /proc are read from (tests point it at a
    fake tree); default `/`."""
    return _env(env).get("VLLM_SYSFS_ROOT", "").strip() or "/"


def api_key(env: Mapping[str, str] | None = None) -> str | None:
    """VLLM_API_KEY: the key `engine serve` requires on /v1 when --api-key is not given."""
    return _env(env).get("VLLM_API_KEY", "").strip() or None


CLIENT_KEY_VARIABLES = ("VLLM_API_KEY", "OPENAI_API_KEY")


def client_api_key(env: Mapping[str, str] | None = None) -> str | None:
    """The key `engine chat` / `engine complete` send when --api-key is not given:
    VLLM_API_KEY (the one `engine serve` reads, so one export serves both), else
    OPENAI_API_KEY (what the openai client and upstream's `vllm chat` read)."""
    env = _env(env)
    for name in CLIENT_KEY_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def ray_address(env: Mapping[str, str] | None = None) -> str | None:
    """RAY_ADDRESS: the Ray cluster (host:port) distributed_executor_backend="ray"
    places ranks on; unset: the cluster Ray finds on this machine, or a new one."""
    return _env(env).get("RAY_ADDRESS", "").strip() or None


def cache_root(env: Mapping[str, str] | None = None) -> str:
    """VLLM_CACHE_ROOT: where the engine keeps what it derives from a model
    (upstream's variable): the config and tokenizer folder of each GGUF file it
    serves, under gguf/. Default ~/.cache/vllm ($XDG_CACHE_HOME/vllm)."""
    env = _env(env)
    root = env.get("VLLM_CACHE_ROOT", "").strip()
    if root:
        return os.path.expanduser(root)
    xdg = env.get("XDG_CACHE_HOME", "").strip() or os.path.expanduser("~/.cache")
    return os.path.join(xdg, "vllm")


def structured_outputs_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """VLLM_STRUCTURED_OUTPUTS_TIMEOUT_S: the longest a request's grammar (a JSON
    schema, regex, EBNF grammar) may take to build in the API server, and again
    to compile in the engine core, before the request is refused (400) naming
    its field (default 10 seconds)."""
    env = _env(env)
    raw = env.get("VLLM_STRUCTURED_OUTPUTS_TIMEOUT_S", "").strip()
    try:
        value = float(raw) if raw else 10.0
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise EnvError(f"VLLM_STRUCTURED_OUTPUTS_TIMEOUT_S={raw!r} must be a positive number "
                       "of seconds")
    return value


def structured_outputs_max_bytes(env: Mapping[str, str] | None = None) -> int:
    """VLLM_STRUCTURED_OUTPUTS_MAX_BYTES: the largest constraint a request may
    carry (a JSON schema, regex, grammar, choices or the tools' schemas, in
    UTF-8 bytes); a larger one is a 400 naming its field (default 256 KiB)."""
    env = _env(env)
    raw = env.get("VLLM_STRUCTURED_OUTPUTS_MAX_BYTES", "").strip()
    if raw and not raw.isdigit():
        raise EnvError(f"VLLM_STRUCTURED_OUTPUTS_MAX_BYTES={raw!r} must be a number of "
                       "bytes")
    return int(raw) if raw else 256 * 1024
