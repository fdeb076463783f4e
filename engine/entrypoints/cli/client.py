"""`engine chat` and `engine complete`: clients of a running server
(engine/entrypoints/cli_client.py)."""
from __future__ import annotations


def add_parser(sub, name: str, help: str) -> None:
    """`engine chat` or `engine complete`."""
    c = sub.add_parser(name, help=help)
    c.add_argument("--url", default="http://localhost:8000/v1",
                   help="the server's API base (default http://localhost:8000/v1)")
    c.add_argument("--model-name", default=None, help="default: the server's first model")
    c.add_argument("--api-key", default=None,
                   help="default: $VLLM_API_KEY, else $OPENAI_API_KEY, else none")
    c.add_argument("--max-tokens", type=int, default=None)
    c.add_argument("-q", "--quick", metavar="TEXT", default=None,
                   help="send one message/prompt, print the answer, exit")
    if name == "chat":
        c.add_argument("--system-prompt", default=None)


def client(args) -> int:
    from engine.entrypoints.cli_client import run

    return run(args)
