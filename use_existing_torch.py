#!/usr/bin/env python3
"""Remove torch pins so a build uses the torch already installed (a nightly, a
custom build): `python use_existing_torch.py [--prefix]`.

Edits requirements/**/*.txt, requirements/**/*.in and pyproject.toml in place,
printing each removed line. Default: every line that pins torch, torchvision or
torchaudio; --prefix: only lines that start with such a pin. Running it again
changes nothing.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PIN = r"""(torch|torchvision|torchaudio)\s*(\[[^\]]*\])?\s*(==|>=|<=|~=|!=|<|>|;|@|["',]|$)"""
ANYWHERE = re.compile(r"(^|[\s\"'\[,])" + PIN, re.IGNORECASE)
AT_START = re.compile(r"^\s*" + PIN, re.IGNORECASE)


def files(root: Path) -> list[Path]:
    req = root / "requirements"
    found = sorted([*req.rglob("*.txt"), *req.rglob("*.in")]) if req.is_dir() else []
    pyproject = root / "pyproject.toml"
    return found + ([pyproject] if pyproject.is_file() else [])


def strip_file(path: Path, prefix_only: bool) -> list[str]:
    pattern = AT_START if prefix_only else ANYWHERE
    kept, removed = [], []
    for line in path.read_text().splitlines(keepends=True):
        code = line.split("#", 1)[0]
        (removed if code.strip() and pattern.search(code) else kept).append(line)
    if removed:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)
    return [r.rstrip("\n") for r in removed]


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix", action="store_true",
                   help="remove only lines that start with a torch/torchvision/torchaudio pin")
    args = p.parse_args(argv)
    total = 0
    for path in files(root):
        removed = strip_file(path, args.prefix)
        for line in removed:
            print(f"{path.relative_to(root)}: removed: {line}")
        total += len(removed)
    print(f"{total} torch pin(s) removed" if total else "no torch pins left; nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
