"""engine.core.long_text: a long text's ids, window by window, equal the
whole text's encoding for each tokenizer family the engine serves."""
from __future__ import annotations

import random

import pytest

from engine.core import long_text
from engine.core.long_text import encode_long

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

CORPUS = ["hello world, this is a test.", "über straße 日本語 テキスト", "def f(x):\n    return x",
          "   leading and  double  spaces", "numbers 1234 5678 and emoji 🙂🙂"] * 20


def _train(tok: Tokenizer, alphabet=()) -> Tokenizer:
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  special_tokens=["<s>", "</s>", "<unk>"], initial_alphabet=list(alphabet))
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    return tok


def byte_level() -> Tokenizer:  # GPT-2, Llama 3, Qwen
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return _train(tok, pre_tokenizers.ByteLevel.alphabet())


def metaspace() -> Tokenizer:  # sentencepiece converted (Mistral, Gemma): a prefix on the first word
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    return _train(tok)


def llama2() -> Tokenizer:  # Llama 2's: "▁" prepended to the text by the normalizer
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    return _train(tok)


def text(rng: random.Random, n: int) -> str:
    pieces = ["hello", "world,", "test.", "über", "日本語", "🙂", "1234", "x" * 40, "def",
              "\n", "\n\n", "    ", "\t", " "]
    return "".join(rng.choice(pieces) + rng.choice(["", " ", "  ", "\n"]) for _ in range(n))


def word_level() -> Tokenizer:  # the test checkpoints': spaces belong to no token
    words = sorted({w for line in CORPUS for w in line.split()})
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>"] + words)},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


@pytest.fixture(scope="module", params=[byte_level, metaspace, llama2, word_level])
def tok(request) -> Tokenizer:
    return request.param()


@pytest.fixture
def small_windows(monkeypatch):
    # many joins from short texts: the same stitching as 64K windows, in milliseconds
    monkeypatch.setattr(long_text, "WINDOW", 1024)
    monkeypatch.setattr(long_text, "OVERLAP", 512)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("special", [True, False])
def test_equal_to_encoding_whole(tok, small_windows, monkeypatch, seed, special):
    joins = []
    join = long_text._join
    monkeypatch.setattr(long_text, "_join", lambda *a: joins.append(join(*a)) or joins[-1])
    t = text(random.Random(seed), 6000)
    assert encode_long(tok, t, special) == tok.encode(t, add_special_tokens=special).ids
    assert len(joins) > 10 and None not in joins  # stitched, not the whole-text fallback


def test_one_enormous_word_is_encoded_whole(tok, small_windows):
    t = "y" * 5000  # no boundary both windows share: the fallback, still exact
    assert encode_long(tok, t) == tok.encode(t).ids


def test_real_windows_on_a_long_text(tok):
    t = text(random.Random(9), 40_000)  # ~250K characters: four 64K windows
    assert len(t) > 3 * long_text.WINDOW
    assert encode_long(tok, t) == tok.encode(t).ids


@pytest.mark.parametrize("at", [0, 9, 10, 25, 39])
def test_check_unicode_finds_a_surrogate_in_any_search_window(monkeypatch, at):
    from engine.core import input_processor

    monkeypatch.setattr(input_processor, "SEARCH_CHARS", 10)
    text = "a" * at + "\udc00" + "b" * (39 - at)
    with pytest.raises(ValueError, match=f"U\\+DC00\\) at character {at}"):
        input_processor.check_unicode(text, "the text")
    input_processor.check_unicode("a" * 40, "the text")
