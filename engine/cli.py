"""The `engine` command."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="engine")
    sub = p.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env", help="print what this installation is and runs on")
    env.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.command == "env":
        from engine.env import main as env_main

        return env_main(["--json"] if args.json else [])
    return 2


if __name__ == "__main__":
    sys.exit(main())
