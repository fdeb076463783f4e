"""MODEL as users give it to vLLM: a checkpoint folder, or a Hugging Face id
(`org/name`) resolved through huggingface_hub's cache, downloading when allowed
(HF_HUB_OFFLINE=1 uses the cache alone)."""
from __future__ import annotations

import os
import re
from pathlib import Path

# What the engine reads from a checkpoint; nothing else is downloaded.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model(model: str | os.PathLike) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    text = str(model)
    if isinstance(model, os.PathLike) or text.startswith(("/", ".", "~")) or \
            not _REPO_ID.match(text) or text.count("/") != 1:
        raise ValueError(f"model {text!r} is not a folder (give a checkpoint folder or a "
                         "Hugging Face id such as org/name)")
    return _from_hub(text)


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a runtime dependency
        raise ValueError(f"model {repo_id!r} is not a folder, and huggingface_hub is not "
                         "installed to look it up as a Hugging Face id") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS,
                                      local_files_only=offline))
    except Exception as exc:  # hub errors are many classes; each becomes one line
        how = ("it is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading"
               if offline else f"it could not be downloaded ({type(exc).__name__}: "
               f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})")
        raise ValueError(f"model {repo_id!r}: {how}; download it where the Hub is reachable "
                         f"(`hf download {repo_id}`) or give a checkpoint "
                         "folder") from None
