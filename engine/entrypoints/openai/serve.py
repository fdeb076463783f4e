"""Start the server: the engine core in a process of its own (it loads the
model while this one waits, answering signals), then uvicorn, until stopped
or until the core dies. With --api-server-count N, N API server processes
accept on the one listening socket, each a client of the one core (as
upstream's), and this process watches them all."""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from multiprocessing.connection import wait

from engine import interrupts
from engine.logger import init_logging

logger = logging.getLogger("engine")

STOP_POLL_S = 0.05
DEAD_GRACE_S = 2.0  # /health answers 503 this long after the core died, then the server exits
GRACEFUL_S = 2  # uvicorn's wait for open responses on SIGTERM (the core then has STOP_GRACE_S)
SWITCH_INTERVAL_S = 0.0005  # how long the event loop may wait for a worker thread's GIL


class _Front:
    """What every API server process loads for itself: the model's config,
    tokenizer and chat template (no weights)."""

    def __init__(self, args):
        from engine.config import ModelConfig, generation_defaults
        from engine.core.input_processor import load_tokenizer
        from engine.entrypoints import chat_utils
        from engine.entrypoints.openai.request_limits import max_token_bytes
        from engine.model_source import resolve_model, tokenizer_folder

        self.path = resolve_model(args.model, getattr(args, "tokenizer", None),
                                  getattr(args, "hf_config_path", None))
        mc = ModelConfig.from_dir(self.path)
        defaults = generation_defaults(self.path, args.generation_config,
                                       args.override_generation_config)
        self.model_config = dataclasses.replace(mc, generation_defaults=defaults)
        # --tokenizer: its folder's tokenizer.json, chat template and special tokens
        tok_path = tokenizer_folder(self.path, args.tokenizer)
        self.tokenizer = load_tokenizer(tok_path)
        self.template = chat_utils.load_template(tok_path, args.chat_template)
        self.special_tokens = chat_utils.special_tokens(tok_path)
        self.max_tok_bytes = max_token_bytes(self.tokenizer)
        tool_calls(args)
        from engine.entrypoints.openai.serving_models import lora_models

        self.lora = lora_models(args, mc, args.served_model_name or [args.model])


def tool_calls(args) -> None:
    """--tool-parser-plugin runs (in every API server process), and
    --tool-call-parser and --reasoning-parser name parsers; ValueError in one
    line otherwise."""
    from engine.entrypoints.openai.tool_parsers import get_tool_parser, import_tool_parser

    if args.tool_parser_plugin:
        import_tool_parser(args.tool_parser_plugin)
    if args.tool_call_parser:
        get_tool_parser(args.tool_call_parser)
    elif args.enable_auto_tool_choice:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME")
    if args.reasoning_parser:
        from engine.reasoning import get_reasoning_parser

        get_reasoning_parser(args.reasoning_parser)


def serve(args) -> int:
    from engine.core.core_client import CoreProcess, EngineCoreStartError, Interrupted
    from engine.engine_args import cli_engine_args
    from engine.entrypoints.openai.stream_pacer import parse_interval

    parse_interval(args.stream_interval)  # before the model loads: bad input fails fast
    from engine.structured_output import StructuredOutputsConfig

    StructuredOutputsConfig.parse(args.structured_outputs_config)
    tool_calls(args)
    count = getattr(args, "api_server_count", 1)
    listener = _listen(args.host, args.port)  # a busy port, too, before minutes of loading
    if listener is None:
        return 1
    t0 = time.perf_counter()
    front = _Front(args)
    stop_asked: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop_asked.append(signum))
    stop_asked += interrupts.take_over()  # one a library swallowed
    core = CoreProcess(str(front.path), args.dtype, cli_engine_args(args), clients=count)
    if count > 1:
        return _serve_many(args, listener, core, stop_asked)
    from engine.core.async_llm import start_engine

    try:
        client, ready = start_engine(core, interrupted=lambda: bool(stop_asked))
    except (Interrupted, EngineCoreStartError) as exc:
        print(f"{exc}; nothing was served" if isinstance(exc, Interrupted) else f"error: {exc}",
              file=sys.stderr)
        # on the way out: the interpreter's last collections would walk the heap
        # torch built (0.5 s of a Ctrl-C's 1 s)
        gc.freeze()
        return 1
    logger.info("engine ready in %.1f s, warm-up %.2f s of it (%s, max_model_len %d, "
                "%d KV blocks of %d tokens)", time.perf_counter() - t0, ready.warm_up_s,
                ready.dtype, ready.max_model_len, ready.num_blocks, ready.block_size)
    try:
        return _run_api_server(args, front, listener, client, ready, stop_asked)
    except BaseException:
        # before the server ran (its own exit stops the core): else the interpreter's
        # exit would wait for the core, which waits for requests, for good
        client.shutdown()
        raise


def _run_api_server(args, front: _Front, listener, client, ready, stop_asked) -> int:
    import uvicorn

    from engine.core import cpu_share
    from engine.core.async_llm import AsyncLLM
    from engine.entrypoints.openai import connection_limits
    from engine.entrypoints.openai.api_server import ServerState, build_app, serve_options
    from engine.entrypoints.openai.metrics import Metrics
    from engine.entrypoints.openai.request_limits import default_max_body_bytes
    from engine.entrypoints.openai.stream_pacer import parse_interval

    names = args.served_model_name or [args.model]
    metrics = Metrics(names[0], engine_totals=client.client_index == 0,
                      max_model_len=ready.max_model_len, cache_info={
                          "block_size": ready.block_size, "num_gpu_blocks": ready.num_blocks,
                          "cache_dtype": "auto", "enable_prefix_caching":
                          args.enable_prefix_caching is not False},
                      engines=args.data_parallel_size)
    options = serve_options(args)
    llm = AsyncLLM(client, ready, front.model_config, front.tokenizer, metrics,
                   max_waiting=args.max_waiting_queue_length,
                   stream_interval=parse_interval(args.stream_interval),
                   max_logprobs=options.max_logprobs)
    state = ServerState(llm=llm, model_names=names, model_dir=front.path, metrics=metrics,
                        api_key=args.api_key, chat_template=front.template,
                        special_tokens=front.special_tokens,
                        max_model_len=ready.max_model_len, created=int(time.time()),
                        max_body_bytes=args.max_request_body_bytes or
                        default_max_body_bytes(ready.max_model_len),
                        max_tok_bytes=front.max_tok_bytes,
                        tool_call_parser=args.tool_call_parser,
                        enable_auto_tool_choice=args.enable_auto_tool_choice,
                        reasoning_parser=args.reasoning_parser, options=options,
                        lora=front.lora)
    if front.template is None and client.client_index == 0 and not ready.pooling_tasks:
        logger.warning("%s has no chat template: /v1/chat/completions will answer 400",
                       front.path)
    app = build_app(state, docs=not args.disable_fastapi_docs,
                    allowed_origins=args.allowed_origins)
    # starlette's request.is_disconnected() imports anyio's asyncio backend on
    # first use: ~50 ms of imports inside the first long request's wait, while
    # /health and every stream wait behind it
    import anyio._backends._asyncio  # noqa: F401
    # the start-up heap (FastAPI, the tokenizer, pydantic's models) lives until
    # exit: an oldest-generation collection that walks it is a pause mid-stream
    gc.collect()
    gc.freeze()
    # a worker thread's GIL-holding stretches (a long /tokenize's JSON, the
    # stitching of its windows) kept the event loop waiting up to the 5 ms
    # switch interval each time it asked for the GIL, a dozen times a request:
    # a one-token completion beside a 10 MB /tokenize took 35-60 ms, not 10
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    cpu_share.attach(client.core.addresses.cpu_share, client.client_index)
    fds = connection_limits.raise_fd_limit()
    logging.getLogger("asyncio").addFilter(connection_limits.AcceptErrorsOncePerSecond())
    config = uvicorn.Config(app, host=args.host, port=args.port,
                            log_level=args.uvicorn_log_level, access_log=False,
                            root_path=args.root_path or "",
                            timeout_graceful_shutdown=GRACEFUL_S,
                            http=connection_limits.guarded_protocol(
                                connection_limits.max_connections(fds)))
    server = uvicorn.Server(config)

    def stop(signum, frame) -> None:
        # uvicorn replaces this while it serves, and calls it again on the way out
        # (it re-raises the signals it caught): Python's own handlers would then
        # end the process with a traceback (SIGINT) or status -15 (SIGTERM)
        server.force_exit = server.should_exit
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    if stop_asked:  # a signal between the core's handshake and here
        server.should_exit = True
    try:
        return _runner()(_serve(server, llm, listener))
    finally:
        gc.unfreeze()  # a caller in the same process (tests) gets its heap back


def _runner():
    """uvloop's run where it is installed (as `vllm serve` runs): its
    callbacks, socket writes and timers cost a fraction of asyncio's, which
    the API server pays per streamed token; else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _listen(host: str, port: int) -> socket.socket | None:
    """The server's socket, bound as uvicorn binds it; None (and one line on
    stderr) when the address cannot be had."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        print(f"error: cannot listen on {host}:{port}: {why}; choose another --port "
              "(or stop what is using it)", file=sys.stderr)
        return None


async def _serve(server, llm, listener: socket.socket) -> int:
    """uvicorn and the engine client's reader in this event loop; a core
    that dies takes the server down DEAD_GRACE_S later (/health says 503
    and why meanwhile), as upstream's."""
    loop = asyncio.get_running_loop()
    from engine.core import cpu_share

    await cpu_share.start_workers()
    llm.start(on_dead=lambda line: loop.call_later(DEAD_GRACE_S, setattr, server,
                                                   "should_exit", True))
    said = asyncio.ensure_future(_say_what_stops(server, llm))
    try:
        await server.serve(sockets=[listener])
    except SystemExit:  # uvicorn exits (3) when it cannot bind; it logged why
        return 1
    finally:
        said.cancel()
        llm.shutdown()
    if llm.dead is not None and not llm.stopped_cleanly:
        print(f"error: the engine stopped: {llm.dead}", file=sys.stderr)
        return 1
    return 0 if server.started else 1


async def _say_what_stops(server, llm) -> None:
    """When the server is asked to stop (SIGTERM, Ctrl-C), one line on what
    was still running: uvicorn then gives open responses GRACEFUL_S."""
    while not server.should_exit:
        await asyncio.sleep(STOP_POLL_S)
    if llm.dead is None:
        logger.info("stopping: %d requests were still running; they have %d s to end",
                    llm.num_requests(), GRACEFUL_S)


# ---- --api-server-count N ----------------------------------------------------------


def _serve_many(args, listener, core, stop_asked) -> int:
    """Start the core and N API server processes on `listener`; wait until
    a signal, or until one of them exits (then stop the rest)."""
    from engine.core.core_client import STOP_GRACE_S
    from engine.spawn import main_not_rerun

    # counters and histograms of N processes, summed by /metrics in each of them
    metrics_dir = tempfile.mkdtemp(prefix="vllm-engine-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    ctx = mp.get_context("spawn")
    servers = []
    try:
        core.start()
        with main_not_rerun():
            for i in range(len(core.addresses.inputs)):
                p = ctx.Process(target=_api_server_main, name=f"APIServer-{i}",
                                args=(args, listener, core.addresses, core.proc.pid, i))
                p.start()
                servers.append(p)
        listener.close()  # the servers have it
        logger.info("%d API servers and one engine core started", len(servers))
        code = _watch(core, servers, stop_asked)
    finally:
        for p in servers:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + GRACEFUL_S + STOP_GRACE_S
        for p in servers:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
        core.stop()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return code


def _watch(core, servers, stop_asked) -> int:
    sentinels = {core.proc.sentinel: None} | {p.sentinel: p for p in servers}
    while not stop_asked:
        ready = wait(list(sentinels), timeout=0.2)
        if not ready:
            continue
        if any(sentinels[s] is None for s in ready):  # the core: its servers say so and exit
            line = core.how_it_ended()
            for p in servers:
                p.join(DEAD_GRACE_S + 3)
            if not core.stopped_cleanly():
                print(f"error: the engine stopped: {line}", file=sys.stderr)
                return 1
            return 0
        p = sentinels[ready[0]]
        if p.exitcode != 0:
            print(f"error: {p.name} exited ({p.exitcode}); stopping the others",
                  file=sys.stderr)
            return 1
        return 0
    logger.info("stopping %d API servers and the engine core", len(servers))
    return 0


def _api_server_main(args, listener, addresses, core_pid: int, index: int) -> None:
    """One of N API server processes: a client of the shared core."""
    from engine.core.core_client import AsyncMPClient, SharedCore

    init_logging(logging.INFO, f"%(levelname)s API server {index}: %(message)s")
    stop_asked: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop_asked.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to decide
    front = _Front(args)
    client = AsyncMPClient(SharedCore(addresses, core_pid), index)
    try:
        ready = client.wait_ready(interrupted=lambda: bool(stop_asked))
    except Exception as exc:  # noqa: BLE001 - the parent names the core's end
        client.shutdown()
        print(f"API server {index}: {exc}", file=sys.stderr)
        sys.exit(1)
    sys.exit(_run_api_server(args, front, listener, client, ready, stop_asked))
