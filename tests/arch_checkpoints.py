"""Small random checkpoints of every architecture beyond the Llama family,
made by transformers (fixed seed, weights wide enough that greedy paths differ
between prompts), with the word-level tokenizer of helpers.make_checkpoint."""
from __future__ import annotations

from pathlib import Path

from helpers import WORDS

_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)

# name -> (config class, model class, config overrides)
ARCHS = {
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=128, word_embed_proj_dim=64,
                                               tie_word_embeddings=False)),
    "opt-proj": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=128, word_embed_proj_dim=32)),
    "opt-post-ln": ("OPTConfig", "OPTForCausalLM",
                    dict(ffn_dim=128, word_embed_proj_dim=64, do_layer_norm_before=False)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(embedding_multiplier=3.0, attention_multiplier=0.2,
                     residual_multiplier=0.5, logits_scaling=2.0)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(partial_rotary_factor=0.75)),
    "phi3-longrope": ("Phi3Config", "Phi3ForCausalLM", dict(
        partial_rotary_factor=0.5, original_max_position_embeddings=16,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0, 1.5, 2.0, 3.0],
                         "long_factor": [2.0, 4.0, 6.0, 9.0]})),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        sliding_window=8, query_pre_attn_scalar=24, attn_logit_softcapping=20.0,
        final_logit_softcapping=10.0, tie_word_embeddings=False, seed=1)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=3, sliding_window=8, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 1000000.0}},
        tie_word_embeddings=False, seed=1)),
    # mixture of experts: top-2 of 8 with renormalised weights; without them
    # and with a shared expert and a dense layer (Qwen2-MoE); q/k norms (Qwen3-MoE)
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=48,
        shared_expert_intermediate_size=96, norm_topk_prob=False, mlp_only_layers=[1],
        tie_word_embeddings=False)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48, norm_topk_prob=True,
        tie_word_embeddings=False)),
}


def word_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok, len(vocab)


def make_arch_checkpoint(folder: Path, arch: str, *, seed: int = 0, init_std: float = 0.2,
                         dtype=None, **overrides) -> Path:
    import torch
    import transformers

    cfg_cls, model_cls, extra = ARCHS[arch]
    tok, vocab = word_tokenizer()
    kw = {**_SHAPE, "vocab_size": vocab, **extra, **overrides}
    seed = kw.pop("seed", seed)
    if arch.startswith("opt"):  # OPT's own names
        kw["num_hidden_layers"] = kw.pop("num_hidden_layers")
        for k in ("intermediate_size", "num_key_value_heads", "head_dim"):
            kw.pop(k)
    config = getattr(transformers, cfg_cls)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # random weights large enough that logits are not near-ties
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, init_std)
            elif "norm" in name or "layernorm" in name:
                p.normal_(0 if "gemma" in arch else 1, 0.2)
            else:
                p.normal_(0, 0.02)
    if dtype is not None:
        model = model.to(dtype)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder
