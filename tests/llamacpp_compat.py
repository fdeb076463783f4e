"""llama-cpp-python as the tests and benchmarks run it. On a CPU with AMX its
extra buffer types (the weights repacked for AMX tiles) crash llama_decode of a
quantized file with a segmentation fault (llama-cpp-python 0.3.36, ggml 0.25.3,
on the 2-core Sapphire Rapids Xeon; F32/F16/BF16 files run): there the weights
stay as the file has them (use_extra_bufts off, which also leaves out its AVX
repacking). Elsewhere llama.cpp runs as it would by default."""
from __future__ import annotations


def has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_int8" in f.read()
    except OSError:
        return False


def model_params(lc):
    """llama_model_default_params(), with the AMX buffers off where they crash."""
    mp = lc.llama_model_default_params()
    if has_amx():
        mp.use_extra_bufts = False
    return mp


def patch_defaults() -> None:
    """Make llama_cpp.Llama(...) load with model_params (it reads the defaults)."""
    import llama_cpp
    import llama_cpp.llama as high

    if has_amx() and not getattr(high.llama_cpp, "_engine_patched", False):
        orig = high.llama_cpp.llama_model_default_params

        def defaults():
            mp = orig()
            mp.use_extra_bufts = False
            return mp

        high.llama_cpp.llama_model_default_params = defaults
        high.llama_cpp._engine_patched = True
    del llama_cpp
