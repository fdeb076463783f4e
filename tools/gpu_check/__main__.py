"""python -m tools.gpu_check: ops, greedy output and kernel timings on one device."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Targets, add_check_argument


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_check",
                                description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="torch device (default: cuda)")
    p.add_argument("--skip-greedy", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    add_check_argument(p)
    args = p.parse_args(argv)
    import torch

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"error: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 1
    from tools.gpu_check import bench, greedy, ops

    failures = ops.run(args.device)
    if not args.skip_greedy:
        with tempfile.TemporaryDirectory() as tmp:
            failures += greedy.run(args.device, Path(tmp))
    targets = Targets()
    if not args.skip_bench:
        bench.run(args.device, targets, log=lambda m: None)
    if failures:
        print(f"\n{len(failures)} check(s) failed:", *failures, sep="\n  ", file=sys.stderr)
    code = targets.finish(args.check) if targets.rows else 0
    return 1 if failures else code


if __name__ == "__main__":
    sys.exit(main())
