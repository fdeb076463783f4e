"""Which runner a checkpoint gets and, for pooling, how it pools (upstream's
--runner / --convert and PoolerConfig): an encoder architecture pools, a
decoder generates unless --runner pooling asks for its embeddings. The
pooling type and normalization come from the checkpoint's
sentence-transformers files (modules.json, its Pooling module's config)
where it has them, as sentence-transformers itself reads them; else [CLS]
for encoders and the last token for decoders, normalized."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.config import ModelConfig
from engine.model_executor.models.registry import POOLING_ARCHITECTURES

RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify", "score")
# sentence-transformers' pooling modes -> ours (the others are refused by name)
_ST_MODES = {"cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}
_ST_LEGACY = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
              "pooling_mode_lasttoken": "lasttoken", "pooling_mode_max_tokens": "max",
              "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
              "pooling_mode_weightedmean_tokens": "weightedmean"}


@dataclass(frozen=True)
class PoolerConfig:
    head: str  # "embed" (pooled hidden states) or "classify" (the checkpoint's classifier)
    pooling: str  # CLS, MEAN or LAST
    normalize: bool  # embeddings' default
    num_labels: int = 0  # classify: its outputs (1: a cross-encoder, which scores pairs)
    matryoshka: tuple[int, ...] | None = None  # the `dimensions` it was trained for, if named

    @property
    def tasks(self) -> tuple[str, ...]:
        """What requests it serves: embeddings (and cosine scores of them), or
        classes (and cross-encoder scores of pairs, with one label)."""
        if self.head == "embed":
            return ("embed", "score")
        return ("classify", "score") if self.num_labels == 1 else ("classify",)


def resolve_runner(mc: ModelConfig, path: Path, runner: str = "auto", convert: str = "auto"
                   ) -> PoolerConfig | None:
    """None: the model generates; else how it pools. ValueError, in one line
    naming the flag, for a combination the model cannot honour."""
    if runner not in RUNNERS:
        raise ValueError(f"--runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    if convert not in CONVERTS:
        raise ValueError(f"--convert must be one of {', '.join(CONVERTS)}, got {convert!r}")
    arch = mc.architecture
    own_head = POOLING_ARCHITECTURES.get(arch)
    if runner == "auto":
        runner = "pooling" if own_head or convert not in ("auto", "none") else "generate"
    if runner == "generate":
        if own_head:
            raise ValueError(f"--runner generate: {arch} is an encoder without an LM head; it "
                             "embeds, classifies or scores (--runner pooling)")
        if convert not in ("auto", "none"):
            raise ValueError(f"--convert {convert} needs --runner pooling")
        return None
    head: str = convert if convert not in ("auto", "none") else (own_head or "embed")
    if head == "score":  # a cross-encoder: the classifier, over pairs
        head = "classify"
    labels = 0
    if head == "classify":
        if own_head != "classify":
            raise ValueError(f"--convert {convert}: {arch} has no classification head; use a "
                             "*ForSequenceClassification checkpoint, or --convert embed")
        from engine.model_executor.models.bert import num_labels

        labels = num_labels(mc)
        if convert == "score" and labels != 1:
            raise ValueError(f"--convert score: a cross-encoder has one label; {arch} has "
                             f"{labels} (--convert classify serves them)")
    pooling, normalize = _pooling_defaults(mc, Path(path), head)
    dims = mc.hf.get("matryoshka_dimensions")
    return PoolerConfig(head, pooling, normalize, labels,
                        tuple(dims) if isinstance(dims, list) and dims else None)


def _pooling_defaults(mc: ModelConfig, path: Path, head: str) -> tuple[str, bool]:
    encoder = mc.architecture in POOLING_ARCHITECTURES
    if head == "classify":
        return "CLS", False  # the classifier reads the first token, as transformers' does
    st = sentence_transformers_pooling(path)
    if st is not None:
        return st
    return ("CLS" if encoder else "LAST"), True


def sentence_transformers_pooling(path: Path) -> tuple[str, bool] | None:
    """(pooling type, normalize) from a sentence-transformers checkpoint's
    modules.json; None when it has none."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text())
        pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
        normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
        if pooling is None:
            return None
        cfg = json.loads((path / pooling.get("path", "") / "config.json").read_text())
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{modules_file}: unreadable sentence-transformers config: {e}") from None
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = [m for key, m in _ST_LEGACY.items() if cfg.get(key)]
        mode = modes[0] if len(modes) == 1 else (modes if modes else "mean")
    if mode not in _ST_MODES:
        raise ValueError(f"{path}: sentence-transformers pooling {mode!r} is not supported; "
                         f"supported: {', '.join(_ST_MODES)}")
    return _ST_MODES[mode], normalize
