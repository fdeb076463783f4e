"""A config.json that is not a sane object is refused in one line naming the
field (engine/config_checks.py), never a traceback from inside the model."""
from __future__ import annotations

import json
import shutil

import pytest

from engine.config import ModelConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


@pytest.mark.parametrize("change, needle", [
    (lambda c: [c], "holds a JSON list, not an object"),
    (lambda c: "llama", "holds a JSON str"),
    (lambda c: {**c, "max_position_embeddings": -5}, "max_position_embeddings must be a positive"),
    (lambda c: {**c, "hidden_size": 0}, "hidden_size must be a positive integer, got 0"),
    (lambda c: {**c, "num_hidden_layers": 2.5}, "num_hidden_layers must be a positive integer"),
    (lambda c: {**c, "vocab_size": True}, "vocab_size must be a positive integer"),
    (lambda c: {**c, "rms_norm_eps": "1e-5"}, "rms_norm_eps must be a positive number"),
    (lambda c: {**c, "rms_norm_eps": -1.0}, "rms_norm_eps must be a positive number"),
    (lambda c: {**c, "num_attention_heads": 7}, "must be a multiple of num_key_value_heads"),
    (lambda c: {k: v for k, v in c.items() if k != "vocab_size"}, "has no vocab_size"),
])
def test_a_config_that_is_not_sane_is_one_line(tiny, tmp_path, change, needle):
    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    cfg = json.loads((tiny / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(change(cfg)))
    with pytest.raises(ValueError) as exc:
        ModelConfig.from_dir(bad)
    msg = str(exc.value)
    assert needle in msg and "config.json" in msg and "\n" not in msg, msg


def test_a_config_that_is_not_json_is_one_line(tiny, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(tiny, bad)
    (bad / "config.json").write_text("{bad")
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        ModelConfig.from_dir(bad)


def test_every_tiny_architecture_passes(tmp_path):
    from engine.tiny_model import ARCHS, make_tiny_model

    for arch in ARCHS:
        ModelConfig.from_dir(make_tiny_model(tmp_path / arch, arch=arch))
