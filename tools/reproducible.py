"""Make a wheel's archive depend on its contents alone: the same commit built
twice, anywhere, gives the same bytes, so publishing it again is a no-op.

The members are rewritten in sorted order (the .dist-info folder last, RECORD
last of all, as the wheel spec recommends), each with one timestamp (the
commit's: SOURCE_DATE_EPOCH), a mode of 0644 or 0755 (executable or not, as
built), and one compression level. The contents are not touched, so RECORD's
hashes stay right.

    python -m tools.reproducible WHEEL... [--epoch SECONDS]
    python -m tools.reproducible --compare A.whl B.whl     (ci/reproducible-check.sh)

--compare checks two builds of one commit: identical bytes, or a report of why
not (diffoscope's, the Debian package, when it is installed; else the members
that differ) and one error line.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import stat
import subprocess
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


def member_differences(a: Path, b: Path) -> list[str]:
    """What differs between two wheels, member by member: the fallback report
    when diffoscope is missing."""
    out = []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        out += [f"only in {a.name}: {n}" for n in sorted(ia.keys() - ib.keys())]
        out += [f"only in {b.name}: {n}" for n in sorted(ib.keys() - ia.keys())]
        if [n for n in ia if n in ib] != [n for n in ib if n in ia]:
            out.append("the members are stored in another order")
        for name in sorted(ia.keys() & ib.keys()):
            x, y = ia[name], ib[name]
            if x.CRC != y.CRC or x.file_size != y.file_size:
                out.append(f"contents differ: {name}")
            for field in ("date_time", "external_attr", "compress_type", "create_system"):
                if getattr(x, field) != getattr(y, field):
                    out.append(f"{field} differs: {name}: {getattr(x, field)} != "
                               f"{getattr(y, field)}")
    return out or ["the members agree; the archives differ in their zip structure"]


def compare(a: Path, b: Path, print_=print) -> bool:
    """True when the two wheels have one name and the same bytes; else print why,
    and False."""
    if a.read_bytes() == b.read_bytes():
        print_(f"identical bytes: sha256 {hashlib.sha256(a.read_bytes()).hexdigest()}")
        return a.name == b.name
    diffoscope = shutil.which("diffoscope")
    if diffoscope:
        report = subprocess.run([diffoscope, "--text", "-", "--no-progress",
                                 "--max-text-report-size", "400000", str(a), str(b)],
                                capture_output=True, text=True)
        print_(report.stdout.rstrip() or report.stderr.rstrip())
    else:
        print_("\n".join(member_differences(a, b)))
        print_("(install diffoscope, the Debian package, for a report of every difference)")
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.reproducible", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheels", nargs="+", type=Path)
    p.add_argument("--epoch", type=int, help="the timestamp (default: SOURCE_DATE_EPOCH)")
    p.add_argument("--compare", action="store_true",
                   help="check that two wheels (two builds of one commit) are the same bytes")
    args = p.parse_args(argv)
    if args.compare:
        if len(args.wheels) != 2 or not all(w.is_file() for w in args.wheels):
            print("error: --compare takes two wheel files", file=sys.stderr)
            return 2
        a, b = args.wheels
        if compare(a, b):
            return 0
        if a.name != b.name:
            print(f"error: the two builds are named differently: {a.name} and {b.name}",
                  file=sys.stderr)
        else:
            print(f"error: two builds of one commit differ: {a} and {b} (the report above "
                  "says where)", file=sys.stderr)
        return 1
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
