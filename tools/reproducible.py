"""Make a wheel's archive depend on its contents alone: the same commit built
twice, anywhere, gives the same bytes, so publishing it again is a no-op.

The members are rewritten in sorted order (the .dist-info folder last, RECORD
last of all, as the wheel spec recommends), each with one timestamp (the
commit's: SOURCE_DATE_EPOCH), a mode of 0644 or 0755 (executable or not, as
built), and one compression level. The contents are not touched, so RECORD's
hashes stay right.

    python -m tools.reproducible WHEEL... [--epoch SECONDS]
"""
from __future__ import annotations

import argparse
import io
import os
import stat
import sys
import time
import zipfile
from pathlib import Path

from tools.atomic import write_atomic
from tools.errors import UserError

#: zip cannot store a time before 1980
ZIP_EPOCH = 315532800


def epoch_from_env(environ=os.environ) -> int:
    """SOURCE_DATE_EPOCH (reproducible-builds.org), which ci/build-wheel.sh sets
    to the commit's time."""
    value = environ.get("SOURCE_DATE_EPOCH")
    if value is None:
        raise UserError("SOURCE_DATE_EPOCH is not set; give --epoch, or set it to the "
                        "commit's time: git log -1 --format=%ct")
    if not value.strip().isdigit():
        raise UserError(f"SOURCE_DATE_EPOCH={value!r}: give whole seconds since 1970")
    return int(value)


def _order(name: str) -> tuple:
    top = name.split("/", 1)[0]
    dist_info = top.endswith(".dist-info")
    return (dist_info, dist_info and name == f"{top}/RECORD", name)


def normalized(data: bytes, epoch: int) -> bytes:
    """The wheel (its bytes) rewritten as the module's doc says."""
    date_time = time.gmtime(max(epoch, ZIP_EPOCH))[:6]
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
        infos = [i for i in src.infolist() if not i.is_dir()]
        names = [i.filename for i in infos]
        if len(set(names)) != len(names):
            raise UserError("the wheel holds a member twice; rebuild it")
        for info in sorted(infos, key=lambda i: _order(i.filename)):
            executable = (info.external_attr >> 16) & 0o111
            new = zipfile.ZipInfo(info.filename, date_time)
            new.compress_type = zipfile.ZIP_DEFLATED
            new.create_system = 3  # Unix, so the mode below is read
            new.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            dst.writestr(new, src.read(info.filename), compresslevel=6)
    return out.getvalue()


def normalize(path: Path, epoch: int) -> bool:
    """Rewrite the wheel at path in place (atomically); True when it changed."""
    data = path.read_bytes()
    try:
        new = normalized(data, epoch)
    except zipfile.BadZipFile:
        raise UserError(f"{path}: not a wheel (not a zip archive)") from None
    if new == data:
        return False
    write_atomic(path, new)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.reproducible", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheels", nargs="+", type=Path)
    p.add_argument("--epoch", type=int, help="the timestamp (default: SOURCE_DATE_EPOCH)")
    args = p.parse_args(argv)
    try:
        epoch = args.epoch if args.epoch is not None else epoch_from_env()
        for w in args.wheels:
            normalize(w, epoch)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
