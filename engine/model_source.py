"""MODEL as users give it to vLLM: a checkpoint folder, a GGUF file (read into
a folder of its config and tokenizer: engine.transformers_utils.gguf_folder),
or a Hugging Face id (`org/name`) resolved through huggingface_hub's cache,
downloading when allowed (HF_HUB_OFFLINE=1 uses the cache alone)."""
from __future__ import annotations

import fnmatch
import os
import re
import stat
from pathlib import Path

# What the engine reads from a checkpoint; nothing else is downloaded.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model(model: str | os.PathLike, tokenizer: str | None = None,
                  hf_config_path: str | None = None) -> Path:
    """The checkpoint folder of MODEL; tokenizer / hf_config_path (folders, as
    upstream's --tokenizer and --hf-config-path) stand in for a GGUF file's own
    (a checkpoint's own tokenizer is replaced by the front end, not here)."""
    from engine.transformers_utils.gguf_folder import gguf_file, gguf_folder, is_gguf

    if is_gguf(model):
        return check_readable(gguf_folder(Path(model), tokenizer, hf_config_path))
    if Path(model).is_dir() and gguf_file(Path(model)) is not None:
        return check_readable(Path(model))  # a GGUF file's folder, the flags already in it
    if hf_config_path:  # --tokenizer is the front end's to read (its tokenizer and template)
        raise ValueError("--hf-config-path is read for GGUF files only; a checkpoint folder or "
                         "Hub id brings its own config.json: drop the flag")
    path = Path(model).expanduser()
    if path.is_dir():
        return check_readable(path)
    text = str(model)
    if isinstance(model, os.PathLike) or text.startswith(("/", ".", "~")) or \
            not _REPO_ID.match(text) or text.count("/") != 1:
        raise ValueError(f"model {text!r} is not a folder (give a checkpoint folder, a .gguf "
                         "file or a Hugging Face id such as org/name)")
    return _from_hub(text)


def tokenizer_folder(path: Path, tokenizer: str | os.PathLike | None) -> Path:
    """The folder whose tokenizer the front end and the core's grammar compiler
    both read: --tokenizer DIR's for a checkpoint (a GGUF file's folder, path,
    was made with it already), else the checkpoint's own."""
    from engine.transformers_utils.gguf_folder import gguf_file

    if tokenizer and gguf_file(path) is None:
        return Path(tokenizer).expanduser()
    return path


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a runtime dependency
        raise ValueError(f"model {repo_id!r} is not a folder, and huggingface_hub is not "
                         "installed to look it up as a Hugging Face id") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS,
                                      local_files_only=offline))
    except Exception as exc:  # hub errors are many classes; each becomes one line
        how = ("it is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading"
               if offline else f"it could not be downloaded ({type(exc).__name__}: "
               f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})")
        raise ValueError(f"model {repo_id!r}: {how}; download it where the Hub is reachable "
                         f"(`hf download {repo_id}`) or give a checkpoint "
                         "folder") from None
    return check_readable(path)


def check_readable(folder: Path) -> Path:
    """folder, once it and every file the engine will open in it can be read; else
    one line naming the first that cannot, its owner, the uid the engine runs as,
    and the fix (a container's user is not the files' owner; save_pretrained
    leaves files 0600)."""
    _must_read(folder, os.R_OK | os.X_OK)
    for p in sorted(folder.iterdir()):
        if p.is_file() and any(fnmatch.fnmatch(p.name, pat) for pat in ALLOW_PATTERNS):
            _must_read(p, os.R_OK)
    return folder


def _must_read(path: Path, mode: int) -> None:
    if os.access(path, mode):
        return
    st = path.stat()
    what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
    raise ValueError(
        f"cannot read the model {what} {path} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid "
        f"{st.st_uid}) as uid {os.getuid()}: make it readable (chmod -R a+rX on the model "
        "folder, on the host when it is mounted) or run as its owner "
        "(docker run --user $(id -u):$(id -g))")
