"""Open a GGUF file (llama.cpp's checkpoint format) with the gguf package's
reader, refusing a malformed one in one line that names the file and what is
wrong: a bad magic or header, a tensor type the format does not define, a
tensor that is not whole blocks of its type or that runs past the end of the
file (truncated, or wrong offsets), missing metadata."""
from __future__ import annotations

from pathlib import Path
from typing import Any

_MISSING = object()


def _checked_reader_class():
    import gguf
    import numpy as np

    class CheckedReader(gguf.GGUFReader):
        """The gguf reader, with each tensor's type and extent checked before the
        reader views it (its own checks end in numpy reshape errors)."""

        def _build_tensors(self, start_offs: int, fields: list) -> None:
            size = len(self.data)
            for field in fields:
                _, name_data, _, dims, raw_type, offset = field.parts
                name = bytes(name_data).decode("utf-8", "replace")
                try:
                    qtype = gguf.GGMLQuantizationType(int(raw_type[0]))
                except ValueError:
                    raise ValueError(f"tensor {name} has tensor type {int(raw_type[0])}, which "
                                     "GGUF does not define (a newer llama.cpp's, or a corrupt "
                                     "file)") from None
                block, type_size = gguf.GGML_QUANT_SIZES[qtype]
                if int(dims[0]) % block:
                    raise ValueError(f"tensor {name}: its rows of {int(dims[0])} values are not "
                                     f"whole {qtype.name} blocks of {block}")
                begin = start_offs + int(offset[0])
                nbytes = int(np.prod(dims, dtype=np.uint64)) // block * type_size
                if begin + nbytes > size:
                    raise ValueError(f"tensor {name} ({qtype.name}, {nbytes} bytes at offset "
                                     f"{begin}) runs past the end of the file ({size} bytes): "
                                     "the file is truncated or its offsets are wrong")
            super()._build_tensors(start_offs, fields)

    return CheckedReader


def open_gguf(path: Path):
    """The file's gguf.GGUFReader (memory-mapped, read-only)."""
    try:
        cls = _checked_reader_class()
    except ImportError:
        raise ValueError(f"{path}: reading GGUF files needs the gguf package "
                         "(pip install gguf)") from None
    try:
        return cls(str(path), "r")
    except ValueError as exc:
        raise ValueError(f"{path}: not a valid GGUF file: {_first_line(exc)}") from None
    except Exception as exc:  # numpy and struct errors of a cut header are many classes
        raise ValueError(f"{path}: not a readable GGUF file (truncated or corrupt header: "
                         f"{type(exc).__name__}: {_first_line(exc)})") from None


def meta(reader, path: Path, key: str, default: Any = _MISSING) -> Any:
    """Metadata `key` as a Python value (str, number, bool or list); a missing
    one is `default`, or one line naming it where there is none."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"{path}: the GGUF metadata has no {key}, which the engine needs; "
                             "the file is incomplete or not a language model")
        return default
    try:
        return field.contents()
    except Exception as exc:  # a value cut short: numpy's errors
        raise ValueError(f"{path}: GGUF metadata {key} is unreadable "
                         f"({type(exc).__name__})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
