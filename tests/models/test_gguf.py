"""GGUF files (llama.cpp's checkpoints) loaded directly: `LLM(model="m.gguf")`
answers with the greedy ids of the same weights as a Hugging Face folder (the
file's tensors dequantized by the gguf package), for every tensor type on every
compiled CPU code path and for each supported family; the tokenizer and chat
template come from the file; a malformed file is refused in one line naming it."""
from __future__ import annotations

import struct
from pathlib import Path
from unittest import mock

import pytest
from gguf_files import QUANT_SHAPE, write_gguf

from engine.sampling_params import SamplingParams

gguf = pytest.importorskip("gguf", reason="gguf is a runtime requirement (requirements/common.txt)")

ENGINE = dict(max_model_len=256, num_kv_blocks=24, block_size=32, bind_threads=False)
# the last is longer than LARGE_M (64) tokens: its prefill runs the dequantised panel
PROMPTS = ["Hello, how are", "The quick brown fox",
           "one two three four five six seven eight nine ten hundred thousand million Monday "
           "Tuesday Wednesday Thursday Friday Saturday Sunday morning evening night. The quick "
           "brown fox jumps over the lazy dog. Hello, how are you today? I am fine, thank you."]
# every type llama.cpp writes for a linear layer, mixed inside fused layers (q/k/v,
# gate/up) as Q4_K_M files mix them; TQ1_0 has no kernel form (dequantized at load)
MIXED = {"token_embd.weight": "Q8_0", "output.weight": "Q6_K",
         "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K",
         "blk.0.attn_v.weight": "Q6_K", "blk.0.attn_output.weight": "Q5_1",
         "blk.0.ffn_gate.weight": "Q8_0", "blk.0.ffn_up.weight": "Q4_0",
         "blk.0.ffn_down.weight": "Q5_K",
         "blk.1.attn_q.weight": "Q4_1", "blk.1.attn_k.weight": "Q5_0",
         "blk.1.attn_v.weight": "Q4_1", "blk.1.attn_output.weight": "F16",
         "blk.1.ffn_gate.weight": "BF16", "blk.1.ffn_up.weight": "F32",
         "blk.1.ffn_down.weight": "TQ1_0"}


def greedy(model, dtype="float32", **kw) -> list[list[int]]:
    from engine.entrypoints.llm import LLM

    llm = LLM(model=str(model), dtype=dtype, **ENGINE, **kw)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module", autouse=True)
def cache_root(work):
    """Also x float at decode (no int8 rounding of x as llama.cpp's, tests/models/
    test_gguf_int8.py): each product equals the dequantized weights' to float rounding."""
    with mock.patch.dict("os.environ", {"VLLM_CACHE_ROOT": str(work / "cache"),
                                        "VLLM_GGUF_INT8_MAX_M": "0"}):
        yield


@pytest.fixture(scope="module")
def tiny(work) -> Path:
    from engine import tiny_model

    return tiny_model.make_tiny_model(work / "tiny")


@pytest.fixture(scope="module")
def mixed(work) -> tuple[Path, Path]:
    """(a GGUF file of every type, the folder of its weights dequantized)."""
    from engine import tiny_model

    with mock.patch.dict(tiny_model.SHAPE, QUANT_SHAPE):
        src = tiny_model.make_tiny_model(work / "tiny-256")
    return write_gguf(src, work / "mixed.gguf", types=MIXED,
                      dequantized_dir=work / "mixed-dequantized"), work / "mixed-dequantized"


@pytest.mark.parametrize("isa", ["avx512_bf16", "avx512", "avx2"])
def test_every_type_greedy_equals_the_dequantized_checkpoint(mixed, isa, caplog):
    from engine import ops

    from engine.platforms.cpu_features import CpuIsaError

    if isa not in ops.compiled_cpu_isas():
        pytest.skip(f"{isa}: not compiled in this build")
    try:
        ops.select_cpu_isa(isa)
    except CpuIsaError as exc:
        pytest.skip(f"{isa} code path not run: {exc}")
    try:
        file, folder = mixed
        with caplog.at_level("INFO", logger="engine"):
            ours = greedy(file)
        assert ours == greedy(folder)
        assert "TQ1_0 tensors dequantized to float32 at load" in caplog.text
        assert "Q4_K tensors dequantized" not in caplog.text  # the kernel runs those
    finally:
        ops.select_cpu_isa("auto")


def test_layers_hold_quantized_blocks(mixed):
    """The quantized layers are the kernels' packed blocks, not a float copy."""
    from engine.entrypoints.llm import LLM

    model = LLM(model=str(mixed[0]), dtype="float32", **ENGINE).core.executor.runner.model
    layers = model.layers
    assert layers[0].qkv.quant_method.bits == 8  # Q4_K q/k beside a Q6_K v: 8 bits,
    assert layers[0].qkv.wna16_group == 16       # Q6_K's groups of 16
    assert layers[0].qkv.gguf_mins is not None  # Q4_K's mins
    assert layers[0].gate_up.quant_method.bits == 8 and layers[0].gate_up.gguf_mins is None
    assert layers[1].qkv.quant_method.bits == 8 and layers[1].qkv.wna16_group == 32
    assert layers[1].down.quant_method is None  # TQ1_0, dequantized
    assert model.lm_head.quant_method.bits == 8  # Q6_K output


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3",
                                  "granite"])
def test_families_equal_their_checkpoint(arch, work):
    """Each family's names, metadata and quirks (Qwen2's biases, Qwen3's q/k
    norms, Phi-3's fused tensors and partial rotary, Gemma's norms + 1 and
    softcaps, Granite's multipliers), its linear layers in Q8_0 (the tiny
    model's down_proj rows of 176 are no whole blocks: F16), answer as the
    checkpoint of the weights the file holds."""
    from engine import tiny_model

    src = tiny_model.make_tiny_model(work / f"tiny-{arch}", arch=arch)
    types = {f"blk.{i}.ffn_down.weight": "F16" for i in range(2)}
    file = write_gguf(src, work / f"{arch}.gguf", "Q8_0", types=types,
                      dequantized_dir=work / f"{arch}-dequantized")
    # transformers reads no Granite file's tokenizer (its GGUF support lacks the
    # architecture): --tokenizer, as the one-line refusal says
    flags = {"tokenizer": str(src)} if arch == "granite" else {}
    assert greedy(file, **flags) == greedy(work / f"{arch}-dequantized")


def _llama3_factors(head_dim: int, theta: float, p: dict):
    """convert_hf_to_gguf.py's rope_freqs for Llama 3.x's rope scaling."""
    import math

    import numpy as np

    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    old, factor = p["original_max_position_embeddings"], p["factor"]
    low, high = p["low_freq_factor"], p["high_freq_factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def test_llama3_rope_factors_become_its_scaling(tiny, work):
    """Llama 3.1+ files carry rope scaling as rope_freqs.weight: read back as the
    checkpoint's rope_scaling, answering as it does; factors of no known
    scaling are refused in one line."""
    import json
    import shutil

    import numpy as np

    p = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    scaled = work / "tiny-llama3"
    shutil.copytree(tiny, scaled)
    cfg = json.loads((tiny / "config.json").read_text())
    (scaled / "config.json").write_text(json.dumps({**cfg, "rope_scaling": p}))
    factors = _llama3_factors(cfg["head_dim"], cfg["rope_theta"], p)
    file = write_gguf(scaled, work / "llama3.gguf", "F32",
                      extra={"rope_freqs.weight": factors})
    from engine.model_source import resolve_model

    got = json.loads((resolve_model(file) / "config.json").read_text())["rope_scaling"]
    assert got == p
    assert greedy(file) == greedy(scaled)
    odd = write_gguf(scaled, work / "odd-rope.gguf", "F32",
                     extra={"rope_freqs.weight": np.linspace(1, 3, len(factors))})
    with pytest.raises(ValueError, match=r"rope_freqs.weight holds rope factors of no known "):
        resolve_model(odd)


def test_yarn_scaling_from_the_metadata(work):
    import json

    from engine import tiny_model
    from engine.model_source import resolve_model

    src = tiny_model.make_tiny_model(work / "tiny-qwen2-yarn", arch="qwen2")
    file = write_gguf(src, work / "yarn.gguf", "F32", meta={
        "qwen2.rope.scaling.type": ("string", "yarn"),
        "qwen2.rope.scaling.factor": ("float32", 4.0),
        "qwen2.rope.scaling.original_context_length": ("uint32", 512),
        "qwen2.rope.scaling.yarn_beta_fast": ("float32", 16.0)})
    cfg = json.loads((resolve_model(file) / "config.json").read_text())
    assert cfg["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0,
                                   "original_max_position_embeddings": 512}


def test_tokenizer_and_chat_template_come_from_the_file(tiny, work):
    from tokenizers import Tokenizer

    from engine.entrypoints import chat_utils
    from engine.model_source import resolve_model

    folder = resolve_model(write_gguf(tiny, work / "tok.gguf", "F32"))
    ours, theirs = (Tokenizer.from_file(str(p / "tokenizer.json")) for p in (folder, tiny))
    for text in PROMPTS + ["<|im_start|>user\nhi<|im_end|>", "ünïcødé ✓"]:
        assert ours.encode(text).ids == theirs.encode(text).ids
    assert chat_utils.load_template(folder) == chat_utils.load_template(tiny)
    assert chat_utils.special_tokens(folder)["bos_token"] == "<|begin_of_text|>"


def test_tokenizer_and_config_flags(tiny, work):
    """--tokenizer DIR and --hf-config-path DIR stand in for the file's own; on a
    checkpoint folder they are refused by name."""
    import json

    from engine.model_source import resolve_model

    file = write_gguf(tiny, work / "flags.gguf", "F32")
    folder = resolve_model(file, tokenizer=str(tiny), hf_config_path=str(tiny))
    assert (folder / "tokenizer.json").read_text() == (tiny / "tokenizer.json").read_text()
    assert json.loads((folder / "config.json").read_text()) == json.loads(
        (tiny / "config.json").read_text())
    assert greedy(file, tokenizer=str(tiny), hf_config_path=str(tiny)) == greedy(tiny)
    assert resolve_model(tiny, tokenizer=str(tiny)) == tiny  # the front end reads it
    with pytest.raises(ValueError, match=r"^--hf-config-path is read for GGUF files only"):
        resolve_model(tiny, hf_config_path=str(tiny))
    with pytest.raises(ValueError, match=r"^--hf-config-path nowhere: not a folder with a "):
        resolve_model(file, hf_config_path="nowhere")


def _tensor_info_offset(file: Path) -> int:
    """Where the last tensor's data offset (uint64) sits in the header."""
    t = gguf.GGUFReader(str(file)).tensors[-1]
    return t.field.offset + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape) + 4


def _malformed(kind: str, good: bytes, at: int) -> bytes:
    data = bytearray(good)
    if kind == "truncated":
        return bytes(data[:-100])
    if kind == "header cut":
        return bytes(data[:200])
    if kind == "wrong offset":
        struct.pack_into("<Q", data, at, 10 ** 9)
    elif kind == "unknown type":
        struct.pack_into("<I", data, at - 4, 99)
    elif kind == "bad magic":
        data[:4] = b"GGUX"
    return bytes(data)


MALFORMED = {"truncated": "runs past the end of the file",
             "header cut": "not a readable GGUF file",
             "wrong offset": "runs past the end of the file",
             "unknown type": "has tensor type 99, which GGUF does not define",
             "bad magic": "GGUF magic invalid"}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_file_is_refused_in_one_line(kind, tiny, work):
    from engine.model_source import resolve_model

    good = write_gguf(tiny, work / "good.gguf", "F32")
    bad = work / f"{kind.replace(' ', '-')}.gguf"
    bad.write_bytes(_malformed(kind, good.read_bytes(), _tensor_info_offset(good)))
    with pytest.raises(ValueError) as exc:
        resolve_model(bad)
    assert str(exc.value).startswith(f"{bad}: ") and MALFORMED[kind] in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("what,needle", [
    ("meta", "the GGUF metadata has no llama.embedding_length"),
    ("tensor", "the GGUF file lacks the tensor for model.layers.1.mlp.down_proj.weight"),
    ("arch", "GGUF architecture 'falcon' is not supported"),
    ("stray", "tensor blk.0.attn_sinks.weight is not a weight of LlamaForCausalLM")])
def test_incomplete_file_is_refused_in_one_line(what, needle, tiny, work):
    file = work / f"incomplete-{what}.gguf"
    if what == "arch":
        w = gguf.GGUFWriter(str(file), "falcon")
        for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file,
                     w.close):
            step()
    else:
        write_gguf(tiny, file, "F32", meta_drop=("llama.embedding_length",) if what == "meta"
                   else (), drop=("blk.1.ffn_down.weight",) if what == "tensor" else (),
                   extra={"blk.0.attn_sinks.weight": [0.0] * 4} if what == "stray" else None)
    with pytest.raises(ValueError) as exc:
        greedy(file)
    assert str(exc.value) == f"{file}: {needle}" or (
        str(exc.value).startswith(f"{file}: {needle}") and "\n" not in str(exc.value))
