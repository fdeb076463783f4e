"""The random Llama checkpoints the engine benchmarks run on (ours and the
vLLM peer on the same files): shapes by name, a word-level tokenizer that
covers the whole vocabulary, and prompts of words."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MODEL_SIZES = {
    "tiny": dict(hidden=256, layers=4, heads=8, kv_heads=2, inter=688, vocab_size=2006),
    # the measurement: random 8-layer 512-hidden Llama
    "small": dict(hidden=512, layers=8, heads=8, kv_heads=8, inter=1376, vocab_size=2006),
    "large": dict(hidden=2048, layers=8, heads=16, kv_heads=16, inter=5456, vocab_size=2006),
    # the shape of SmolLM-135M (a real small Llama)
    "smollm": dict(hidden=576, layers=30, heads=9, kv_heads=3, inter=1536, vocab_size=49152),
    # 117M parameters (470 MB in float32): one token's forward reads them all
    "medium": dict(hidden=1024, layers=8, heads=16, kv_heads=4, inter=2816, vocab_size=8192),
}
MAX_POS = 1024  # the peer runs with max_model_len=1024

# --arch -> (experts, experts per token, each expert's intermediate / the size's
# dense one): Qwen3-MoE's many small experts (the active MLP of the dense
# model), Mixtral's few whole-MLP ones
MOE_ARCHS = {"qwen3_moe": (16, 4, 4), "mixtral": (8, 2, 1)}
ARCHS = ("llama", *MOE_ARCHS)


def moe_config(size: str, arch: str) -> dict:
    """The MoE keys of config.json for a size (none for llama)."""
    if arch not in MOE_ARCHS:
        return {}
    experts, top_k, div = MOE_ARCHS[arch]
    if arch == "mixtral":  # each expert the size's whole MLP (div 1)
        return dict(num_local_experts=experts, num_experts_per_tok=top_k)
    return dict(num_experts=experts, num_experts_per_tok=top_k,
                moe_intermediate_size=MODEL_SIZES[size]["inter"] // div, norm_topk_prob=True)


def num_params(size: str, arch: str = "llama", experts: float | None = None) -> int:
    """Parameters; for an MoE, with `experts` per layer instead of all of them
    (the ones a step reads, or the top_k one token multiplies with)."""
    s = MODEL_SIZES[size]
    h, i, v, layers = s["hidden"], s["inter"], s["vocab_size"], s["layers"]
    kv = h // s["heads"] * s["kv_heads"]
    mlp = 3 * h * i
    if arch in MOE_ARCHS:
        count, _, div = MOE_ARCHS[arch]
        mlp = (count if experts is None else experts) * 3 * h * (i // div) + h * count  # + router
    return round(2 * v * h + layers * (2 * h * h + 2 * h * kv + mlp + 2 * h) + h)


def read_params(size: str, arch: str, batch: int) -> int:
    """Parameters one decode step of `batch` sequences reads: for an MoE, the
    experts its tokens are expected to pick under uniform routing, each once."""
    if arch not in MOE_ARCHS:
        return num_params(size)
    experts, top_k, _ = MOE_ARCHS[arch]
    return num_params(size, arch, experts * (1 - (1 - top_k / experts) ** batch))


def active_params(size: str, arch: str) -> int:
    """Parameters one token multiplies with (2 flops each)."""
    return num_params(size, arch, MOE_ARCHS[arch][1] if arch in MOE_ARCHS else None)


def make_model(folder: Path, size: str, max_pos: int = MAX_POS, arch: str = "llama",
               init_std: float = 0.02) -> Path:
    """The checkpoint (transformers writes it, fixed seed), with a tokenizer
    whose every id is a word, so that any generated id decodes in both engines."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import WORDS, make_checkpoint
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    shape = MODEL_SIZES[size]
    make_checkpoint(folder, arch, max_pos=max_pos, init_std=init_std,
                    **{**shape, **moe_config(size, arch)})
    words = list(dict.fromkeys(WORDS))
    words += [f"w{i}" for i in range(shape["vocab_size"] - 3 - len(words))]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": max_pos}))
    return folder


def prompt_ids(n: int, words: int = 32, seed: int = 0) -> list[list[int]]:
    """n prompts of `words` word tokens after <s> (ids of the tokenizer above)."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 105) for _ in range(words)] for _ in range(n)]
