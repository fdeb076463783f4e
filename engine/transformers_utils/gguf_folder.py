"""MODEL given as a GGUF file: a folder of the Hugging Face checkpoint it
stands for (config.json, generation_config.json, tokenizer files and a
gguf.json naming the file), derived once per file under VLLM_CACHE_ROOT/gguf/,
so that every part of the engine that reads a checkpoint folder reads this
one; the weights stay in the file (engine.model_executor.gguf_loader reads
them). The tokenizer comes from the file through transformers' GGUF support,
or from --tokenizer DIR; the config from the file's metadata, or from
--hf-config-path DIR, as upstream's flags."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from engine import envs

logger = logging.getLogger("engine")

POINTER = "gguf.json"  # in the folder: {"file": the GGUF file's absolute path}
# what --tokenizer DIR lends the folder
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                    "special_tokens_map.json")


def is_gguf(model: str | os.PathLike) -> bool:
    return str(model).lower().endswith(".gguf")


def gguf_file(folder: Path) -> Path | None:
    """The GGUF file behind a folder made here, else None (a checkpoint folder)."""
    pointer = Path(folder) / POINTER
    if not pointer.is_file():
        return None
    return Path(json.loads(pointer.read_text())["file"])


def gguf_folder(file: Path, tokenizer: str | None = None,
                hf_config_path: str | None = None) -> Path:
    """The folder for `file` (made on first use; one per file, its size and
    mtime, and the two flags)."""
    file = Path(file).expanduser().resolve()
    if not file.is_file():
        raise ValueError(f"model {file}: no such GGUF file")
    if not os.access(file, os.R_OK):
        raise ValueError(f"model {file}: cannot read the GGUF file as uid {os.getuid()}; "
                         "make it readable (chmod a+r)")
    st = file.stat()
    flags = [_stamp(p) for p in (tokenizer, hf_config_path)]
    key = hashlib.sha256(json.dumps([str(file), st.st_size, st.st_mtime_ns, *flags]).encode())
    folder = Path(envs.cache_root()) / "gguf" / f"{file.stem}-{key.hexdigest()[:16]}"
    if (folder / POINTER).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=folder.parent))
    try:
        _fill(tmp, file, tokenizer, hf_config_path)
        try:
            tmp.rename(folder)  # nothing half-written under the name; a racing maker's wins
        except OSError:
            if not (folder / POINTER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("GGUF %s: config and tokenizer in %s", file.name, folder)
    return folder


def _stamp(folder: str | None) -> list:
    """A flag's folder as it is now: its path and its files' sizes and mtimes."""
    if not folder:
        return []
    path = Path(folder).expanduser().resolve()
    files = sorted(p for p in path.glob("*") if p.is_file()) if path.is_dir() else []
    return [str(path)] + [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _fill(out: Path, file: Path, tokenizer: str | None, hf_config_path: str | None) -> None:
    from engine.transformers_utils import gguf_config
    from engine.transformers_utils.gguf_reader import open_gguf

    reader = open_gguf(file)
    if hf_config_path:
        src = _flag_dir("--hf-config-path", hf_config_path, "config.json")
        shutil.copy(src / "config.json", out / "config.json")
        if (src / "generation_config.json").is_file():
            shutil.copy(src / "generation_config.json", out / "generation_config.json")
    else:
        gguf_config.architecture(reader, file)  # an unsupported one named before the tokenizer
        (out / "config.json").write_text(json.dumps(gguf_config.hf_config(reader, file),
                                                    indent=2) + "\n")
        (out / "generation_config.json").write_text(
            json.dumps(gguf_config.generation_config(reader, file), indent=2) + "\n")
    if tokenizer:
        src = _flag_dir("--tokenizer", tokenizer, "tokenizer.json")
        for name in _TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copy(src / name, out / name)
    else:
        _tokenizer_from_gguf(file, out)
    (out / POINTER).write_text(json.dumps({"file": str(file)}) + "\n")


def _flag_dir(flag: str, value: str, needs: str) -> Path:
    src = Path(value).expanduser()
    if not (src / needs).is_file():
        raise ValueError(f"{flag} {value}: not a folder with a {needs}")
    return src


def _tokenizer_from_gguf(file: Path, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json (chat template, special tokens)
    as transformers converts the file's tokenizer.ggml.* metadata."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(f"{file}: reading a GGUF file's tokenizer needs transformers; install "
                         "it or give --tokenizer DIR (a folder with tokenizer.json)") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
        tok.save_pretrained(str(out))
    except Exception as exc:  # transformers' conversion errors are many classes
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{file}: its tokenizer could not be read ({type(exc).__name__}: "
                         f"{text}); give --tokenizer DIR (a folder with tokenizer.json)") from None
    if not (out / "tokenizer.json").is_file():
        raise ValueError(f"{file}: transformers made no fast tokenizer of it; give "
                         "--tokenizer DIR (a folder with tokenizer.json)")
