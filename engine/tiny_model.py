"""`engine make-tiny-model DIR [--arch NAME]`: a small random checkpoint of any
supported architecture (a Llama by default), with a byte-level BPE tokenizer
trained here and a chat template, so that the engine and its server can be
tried without a network. Its output is gibberish."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Enough text for the tokenizer to learn common English pieces; any text still
# encodes, since a byte-level BPE falls back to single bytes.
CORPUS = [
    'The quick brown fox jumps over the lazy dog. Hello, how are you today? I am fine, thank you.',
    'What is the capital of France? Paris is the capital of France. Tell me a story about a cat.',
    'Once upon a time there was a small engine that served language models on a laptop.',
    'Write a poem about the sea. The sea is wide and blue, and the wind moves over the water.',
    'Explain how a computer works. A computer reads instructions and numbers from memory.',
    'You are a helpful assistant. The user asks a question and the assistant answers it.',
    'one two three four five six seven eight nine ten hundred thousand million',
    'Monday Tuesday Wednesday Thursday Friday Saturday Sunday morning evening night',
    '',
]

BOS, EOS, IM_START, IM_END = "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"
# ChatML, the format many small chat models use.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

SHAPE: dict[str, Any] = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             max_position_embeddings=2048)

# --arch NAME -> config.json keys beyond SHAPE: each supported architecture's
# own features switched on, at the same small size
ARCHS: dict[str, dict[str, Any]] = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama"),
    "mistral": dict(architectures=["MistralForCausalLM"], model_type="mistral",
                    sliding_window=1024),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2"),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3"),
    "granite": dict(architectures=["GraniteForCausalLM"], model_type="granite",
                    embedding_multiplier=3.0, attention_multiplier=0.2,
                    residual_multiplier=0.5, logits_scaling=2.0),
    "phi3": dict(architectures=["Phi3ForCausalLM"], model_type="phi3",
                 partial_rotary_factor=0.75),
    "olmo2": dict(architectures=["Olmo2ForCausalLM"], model_type="olmo2"),
    "opt": dict(architectures=["OPTForCausalLM"], model_type="opt", ffn_dim=176,
                word_embed_proj_dim=64, do_layer_norm_before=True,
                activation_function="relu", num_key_value_heads=None, head_dim=None),
    "gemma2": dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", sliding_window=64,
                   query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh"),
    "gemma3": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                   sliding_window=64, query_pre_attn_scalar=16,
                   layer_types=["sliding_attention", "full_attention"],
                   hidden_activation="gelu_pytorch_tanh"),
    "mixtral": dict(architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_local_experts=8, num_experts_per_tok=2, intermediate_size=64),
    "qwen2_moe": dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe",
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                      shared_expert_intermediate_size=96, norm_topk_prob=False),
    "qwen3_moe": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
                      norm_topk_prob=True),
}


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=[BOS, EOS, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def _checkpoint_shapes(config: dict) -> dict:
    """Every tensor the engine's model for `config` reads, with its shape: the
    model names them itself (checkpoint_map), so each architecture's tensors
    come from the code that loads them."""
    import tempfile

    import torch

    from engine.config import ModelConfig
    from engine.model_executor.models.registry import model_class

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config))
        c = ModelConfig.from_dir(Path(d))
    model = model_class(c.architecture)(c, torch.float32)
    params = dict(model.named_parameters())
    shapes, seen = {}, set()
    # one key per parameter part: the current name where the map also takes an
    # older one (OPT's first exports, without "model."), else the map's first
    # (an encoder's own checkpoints, before those of the same encoder under a head)
    items = list(model.checkpoint_map().items())
    for _, (key, (name, part)) in sorted(enumerate(items), key=lambda ikv: (
            not ikv[1][0].startswith("model."), ikv[0])):
        if (name, part) in seen:
            continue
        seen.add((name, part))
        shape = tuple(params[name].shape)
        shapes[key] = shape if part is None else (params[name].shard_sizes[part], *shape[1:])
    # drawn in the keys' order ("model." first): a seed keeps giving the same weights
    return dict(sorted(shapes.items(), key=lambda kv: (not kv[0].startswith("model."), kv[0])))


def _random(key: str, shape: tuple, gemma: bool, g, init_std: float):
    import torch

    if len(shape) > 1:
        return torch.randn(shape, generator=g) * init_std
    if "norm" in key or "layer_norm" in key:  # (1 + w) norms for Gemma, LayerNorm biases 0
        return torch.zeros(shape) if gemma or key.endswith(".bias") else torch.ones(shape)
    return torch.randn(shape, generator=g) * 0.02  # biases


def check_new_folder(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} exists and is not an empty folder; choose a new one")


@contextmanager
def checkpoint_folder(folder: Path, tensors: dict, tok, config: dict):
    """folder's checkpoint, written as folder.partial: the weights, tokenizer.json
    and config.json, then what the caller writes into the folder it is given;
    renamed to folder at the end, so nothing half-written has the user's name."""
    import shutil

    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    yield tmp
    if folder.exists():
        folder.rmdir()
    tmp.rename(folder)


def make_tiny_model(folder: str | Path, *, arch: str = "llama", seed: int = 0,
                    vocab_size: int = 512, init_std: float = 0.2) -> Path:
    """Write the checkpoint into folder (created; must be empty or absent)."""
    import torch

    if arch not in ARCHS:
        raise ValueError(f"--arch {arch!r} is not one of: {', '.join(ARCHS)} (pooling models: "
                         "engine.tiny_pooling_model)")
    folder = Path(folder)
    check_new_folder(folder)
    tok = build_tokenizer(vocab_size)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    im_end = tok.token_to_id(IM_END)
    config = {k: v for k, v in {**SHAPE, **ARCHS[arch]}.items() if v is not None}
    config.update(vocab_size=vocab, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False, bos_token_id=bos, eos_token_id=[eos, im_end],
                  pad_token_id=eos,
                  torch_dtype="float32")
    if arch != "opt":
        config.setdefault("hidden_act", "silu")
    g = torch.Generator().manual_seed(seed)
    # large random weights keep the logits far from ties, so that greedy output
    # does not depend on how requests happen to be batched
    tensors = {k: _random(k, shape, arch.startswith("gemma"), g, init_std).contiguous()
               for k, shape in _checkpoint_shapes(config).items()}
    with checkpoint_folder(folder, tensors, tok, config) as tmp:
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": bos, "eos_token_id": [eos, im_end]}, indent=2) + "\n")
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": IM_END,
             "pad_token": EOS, "model_max_length": SHAPE["max_position_embeddings"],
             "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False},
            indent=2) + "\n")
    return folder
