"""The `engine` command: generate, bench, env, serve, chat, complete,
make-tiny-model, quantize. Here the top-level parser, the dispatch and how a
command's failure ends the process; each sub-command's flags and handler are in
engine/entrypoints/cli/ (as upstream's vllm/entrypoints/cli/). Heavy modules
(torch, FastAPI) are imported by the command that needs them, so that
`engine --help` stays fast."""
from __future__ import annotations

import argparse
import signal
import sys

from engine.entrypoints.cli import client, offline, serve, tools

# the flag groups, by the names tests and scripts import them from here
from engine.entrypoints.cli.args import (  # noqa: F401
    gguf_args,
    lora_args,
    parallel_args,
    runner_args,
    scheduler_args,
    speculative_args,
)


def main(argv: list[str] | None = None) -> int:
    from engine import interrupts

    previous = interrupts.install(argv[0] if argv else sys.argv[1] if len(sys.argv) > 1 else "")
    try:
        return _main(argv)
    finally:  # cli.main called in-process (tests, scripts) leaves SIGINT as it was
        interrupts.take_over()
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="engine")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    offline.add_parsers(sub)
    serve.add_parser(sub)
    client.add_parser(sub, "chat", "chat with a running server (like `vllm chat`)")
    client.add_parser(sub, "complete",
                      "complete prompts on a running server (like `vllm complete`)")
    tools.add_parsers(sub)
    args = _parse(p, sub, argv)
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # `engine complete ... | head -c 80`: the reader left, quietly
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, as a program the pipe killed
    except ValueError as exc:  # configuration and input errors (EnvError included): one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        from engine._kernels import TorchMismatchError

        if not isinstance(exc, TorchMismatchError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler: one line, no traceback
        print(f"engine {args.command}: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        from engine.distributed.parallel_state import RankDiedError

        if not isinstance(exc, RankDiedError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _parse(p: argparse.ArgumentParser, sub, argv: list[str] | None) -> argparse.Namespace:
    """Parse argv; a mistyped command or option is refused by the command's
    own parser (its usage, not the top level's), with the nearest spelling."""
    import difflib

    argv = sys.argv[1:] if argv is None else list(argv)
    words = [a for a in argv if not a.startswith("-")]
    if words and words[0] not in sub.choices and argv and not argv[0].startswith("-"):
        near = difflib.get_close_matches(words[0], list(sub.choices), n=1)
        p.error(f"unknown command {words[0]!r}"
                + (f"; did you mean {near[0]!r}?" if near else
                   f"; choose from {', '.join(sub.choices)}"))
    args, extra = p.parse_known_args(argv)
    if extra and args.command == "serve":
        from engine.entrypoints.openai.cli_args import not_taken

        line = not_taken(extra)
        if line:
            print(f"error: {line}", file=sys.stderr)
            raise SystemExit(2)
    if extra:
        cmd = sub.choices[args.command]
        known = [o for a in cmd._actions for o in a.option_strings]
        hints = []
        for word in extra:
            near = difflib.get_close_matches(word.split("=")[0], known, n=1) \
                if word.startswith("-") else []
            hints.append(f"{word} (did you mean {near[0]}?)" if near else word)
        cmd.error(f"unrecognized arguments: {' '.join(hints)}")
    return args


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush then finds no
    closed pipe to complain of."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("vllm-engine")
    except metadata.PackageNotFoundError:  # a source tree run without installing
        return "unknown (not installed)"


COMMANDS = {"env": tools.env, "generate": offline.generate, "bench": offline.bench,
            "serve": serve.serve, "chat": client.client, "complete": client.client,
            "make-tiny-model": tools.make_tiny_model, "quantize": tools.quantize}


if __name__ == "__main__":
    sys.exit(main())
