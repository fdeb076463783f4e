"""`engine make-tiny-model DIR --arch bert|xlm-roberta|qwen3-embedding|...`:
small random pooling checkpoints (engine.tiny_model writes the generative
ones): BERT-family encoders as embedding models and as cross-encoder
rerankers, and a Qwen3-Embedding-style decoder. Each carries a tokenizer
with its family's special tokens and pair template, and (the embedding
models) the sentence-transformers files that name its pooling, so that
transformers, sentence-transformers' SentenceTransformer and CrossEncoder
load it as the engine does."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.tiny_model import (
    ARCHS,
    CORPUS,
    SHAPE,
    _checkpoint_shapes,
    _random,
    check_new_folder,
    checkpoint_folder,
)

_ENCODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=512, hidden_act="gelu",
                layer_norm_eps=1e-12, type_vocab_size=2, pad_token_id=0)
_ROBERTA = dict(_ENCODER, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
                bos_token_id=0, eos_token_id=2)
_RERANKER = dict(num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})

# --arch NAME -> (config.json, the tokenizer's family, sentence-transformers pooling or None)
POOLING_ARCHS: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "bert": (dict(_ENCODER, architectures=["BertModel"], model_type="bert"), "bert", "mean"),
    "bert-reranker": (dict(_ENCODER, **_RERANKER, architectures=["BertForSequenceClassification"],
                           model_type="bert"), "bert", None),
    "roberta": (dict(_ROBERTA, architectures=["RobertaModel"], model_type="roberta"),
                "roberta", "cls"),
    "roberta-reranker": (dict(_ROBERTA, **_RERANKER,
                              architectures=["RobertaForSequenceClassification"],
                              model_type="roberta"), "roberta", None),
    "xlm-roberta": (dict(_ROBERTA, architectures=["XLMRobertaModel"], model_type="xlm-roberta"),
                    "roberta", "cls"),
    "xlm-roberta-reranker": (dict(_ROBERTA, **_RERANKER,
                                  architectures=["XLMRobertaForSequenceClassification"],
                                  model_type="xlm-roberta"), "roberta", None),
    # as Qwen/Qwen3-Embedding: a Qwen3 decoder, tied embeddings, last-token pooling
    # of the end-of-text token its tokenizer appends (--runner pooling serves it)
    "qwen3-embedding": (dict(SHAPE, **ARCHS["qwen3"], tie_word_embeddings=True,
                             rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu"),
                        "qwen3", "lasttoken"),
}

# family -> (special tokens, first ones first; [CLS]-like, [SEP]-like, pad; single, pair)
_TOKENS = {
    "bert": (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", "[PAD]",
             "[CLS] $A:0 [SEP]:0", "[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1"),
    "roberta": (["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s>", "</s>", "<pad>",
                "<s> $A:0 </s>:0", "<s> $A:0 </s>:0 </s>:0 $B:0 </s>:0"),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|endoftext|>",
              "<|endoftext|>", "$A:0 <|endoftext|>:0", "$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1"),
}


def _tokenizer(family: str, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials, cls, sep, pad, single, pair = _TOKENS[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    named = [t for t in (cls, sep) if t is not None]
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, tok.token_to_id(t)) for t in named])
    return tok, cls, sep, pad


def make_tiny_pooling_model(folder: str | Path, *, arch: str = "bert", seed: int = 0,
                            vocab_size: int = 512, init_std: float = 0.2,
                            sizes: dict | None = None) -> Path:
    """Write the checkpoint into folder (created; must be empty or absent);
    sizes: config.json sizes instead of the tiny ones (the benchmarks')."""

    import torch

    if arch not in POOLING_ARCHS:
        raise ValueError(f"--arch {arch!r} is not one of: {', '.join(POOLING_ARCHS)}")
    folder = Path(folder)
    check_new_folder(folder)
    config, family, st_pooling = POOLING_ARCHS[arch]
    config = {**config, **(sizes or {})}
    tok, cls, sep, pad = _tokenizer(family, vocab_size)
    config = {k: v for k, v in config.items() if v is not None}
    config.update(vocab_size=tok.get_vocab_size(), pad_token_id=tok.token_to_id(pad),
                  torch_dtype="float32")
    if family == "qwen3":
        config.update(bos_token_id=tok.token_to_id(sep), eos_token_id=tok.token_to_id(sep))
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, shape in _checkpoint_shapes(config).items():
        if "LayerNorm" in key:  # a LayerNorm: weight 1, bias 0, as initialized
            tensors[key] = torch.ones(shape) if key.endswith(".weight") else torch.zeros(shape)
        else:
            tensors[key] = _random(key, shape, False, g, init_std).contiguous()
    if family != "qwen3" and not any(k.startswith("classifier.") for k in tensors):
        h = config["hidden_size"]  # the base model's pooler, as its checkpoints carry (unread)
        tensors["pooler.dense.weight"] = _random("pooler", (h, h), False, g, init_std)
        tensors["pooler.dense.bias"] = torch.zeros(h)
    tok_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad,
        # RoBERTa's positions start past the padding id: two fewer
        "model_max_length": config["max_position_embeddings"] - (2 if family == "roberta" else 0),
        "clean_up_tokenization_spaces": False}
    if cls is not None:
        tok_config.update(cls_token=cls, sep_token=sep)
    if family == "qwen3":  # as Qwen3-Embedding's: the last token is every text's own
        tok_config.update(eos_token=sep, padding_side="left")
    # BERT's tokenizers send token types (a pair's second text is type 1); RoBERTa's do not
    tok_config["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"] \
        if family == "bert" else ["input_ids", "attention_mask"]
    with checkpoint_folder(folder, tensors, tok, config) as tmp:
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
        if st_pooling is not None:
            _sentence_transformers_files(tmp, st_pooling, config["hidden_size"],
                                         tok_config["model_max_length"])
    return folder


def _sentence_transformers_files(folder: Path, pooling: str, hidden: int,
                                 max_seq_length: int) -> None:
    """modules.json (Transformer, Pooling, Normalize) and the Pooling module's
    config, in the form the published checkpoints carry."""
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize"}]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_seq_length, "do_lower_case": False}) + "\n")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_cls_token": pooling == "cls",
         "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
         "pooling_mode_mean_sqrt_len_tokens": False,
         "pooling_mode_lasttoken": pooling == "lasttoken",
         "include_prompt": True}, indent=2) + "\n")
    (folder / "2_Normalize").mkdir()
