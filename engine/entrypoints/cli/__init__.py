"""The `engine` command's sub-commands (engine/cli.py parses and dispatches), one
module a job, as upstream's vllm/entrypoints/cli/: the flag groups several
commands share (args.py), offline generation and benchmarking (offline.py), the
server (serve.py), the clients of a running server (client.py) and the tools
(make-tiny-model, quantize, env: tools.py). Heavy modules (torch, FastAPI) are
imported by the handler that needs them, so that `engine --help` stays fast."""
