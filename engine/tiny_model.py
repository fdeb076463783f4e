"""`engine make-tiny-model DIR`: a small random Llama checkpoint, with a
byte-level BPE tokenizer trained here and a chat template, so that the engine
and its server can be tried without a network. Its output is gibberish."""
from __future__ import annotations

import json
from pathlib import Path

# Enough text for the tokenizer to learn common English pieces; any text still
# encodes, since a byte-level BPE falls back to single bytes.
CORPUS = """\
The quick brown fox jumps over the lazy dog. Hello, how are you today? I am fine, thank you.
What is the capital of France? Paris is the capital of France. Tell me a story about a cat.
Once upon a time there was a small engine that served language models on a laptop.
Write a poem about the sea. The sea is wide and blue, and the wind moves over the water.
Explain how a computer works. A computer reads instructions and numbers from memory.
You are a helpful assistant. The user asks a question and the assistant answers it.
one two three four five six seven eight nine ten hundred thousand million
Monday Tuesday Wednesday Thursday Friday Saturday Sunday morning evening night
""".split("\n")

BOS, EOS, IM_START, IM_END = "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"
# ChatML, the format many small chat models use.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

SHAPE = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048)


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


def make_tiny_model(folder: str | Path, *, seed: int = 0, vocab_size: int = 512,
                    init_std: float = 0.2) -> Path:
    """Write the checkpoint into folder (created; must be empty or absent)."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} exists and is not an empty folder; choose a new one")
    tok = build_tokenizer(vocab_size)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    im_end = tok.token_to_id(IM_END)
    s = SHAPE
    head_dim = s["hidden_size"] // s["num_attention_heads"]
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab,
                  **s, head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=10000.0,
                  hidden_act="silu", tie_word_embeddings=False, bos_token_id=bos,
                  eos_token_id=[eos, im_end], torch_dtype="float32")
    h, i, kv = s["hidden_size"], s["intermediate_size"], s["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
              "lm_head.weight": (vocab, h)}
    for n in range(s["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h),
                       p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h),
                       p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                       p + "mlp.down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    g = torch.Generator().manual_seed(seed)
    # large random weights keep the logits far from ties, so that greedy output
    # does not depend on how requests happen to be batched
    tensors = {k: (torch.ones(shape) if len(shape) == 1 else
                   torch.randn(shape, generator=g) * init_std).contiguous()
               for k, shape in shapes.items()}
    tmp = folder.with_name(folder.name + ".partial")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": [eos, im_end]}, indent=2) + "\n")
    (tmp / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": IM_END,
         "pad_token": EOS, "model_max_length": s["max_position_embeddings"],
         "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    if folder.exists():
        folder.rmdir()
    tmp.rename(folder)  # nothing half-written under the name the user gave
    return folder
