"""Start the server: the engine core in a process of its own (it loads the
model while this one waits, answering signals), then uvicorn in this one,
until stopped or until the core dies."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import sys
import time

logger = logging.getLogger("engine")

STOP_POLL_S = 0.05
DEAD_GRACE_S = 2.0  # /health answers 503 this long after the core died, then the server exits
GRACEFUL_S = 2  # uvicorn's wait for open responses on SIGTERM (the core then has STOP_GRACE_S)


def serve(args) -> int:
    import uvicorn

    from engine.config import ModelConfig
    from engine.core.async_llm import AsyncLLM, start_engine
    from engine.core.core_client import EngineCoreStartError, Interrupted
    from engine.core.input_processor import load_tokenizer
    from engine.engine_args import cli_engine_args
    from engine.entrypoints import chat_utils
    from engine.entrypoints.openai.api_server import ServerState, build_app
    from engine.entrypoints.openai.metrics import Metrics
    from engine.entrypoints.openai.stream_pacer import parse_interval
    from engine.model_source import resolve_model

    interval = parse_interval(args.stream_interval)  # before the model loads: bad input fails fast
    listener = _listen(args.host, args.port)  # a busy port, too, before minutes of loading
    if listener is None:
        return 1
    t0 = time.perf_counter()
    path = resolve_model(args.model)
    model_config = ModelConfig.from_dir(path)
    tokenizer = load_tokenizer(path)
    template = chat_utils.load_template(path, args.chat_template)

    stop_asked: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop_asked.append(signum))
    try:
        core, client, ready = start_engine(str(path), args.dtype, cli_engine_args(args),
                                           interrupted=lambda: bool(stop_asked))
    except Interrupted as exc:
        print(f"{exc}; nothing was served", file=sys.stderr)
        return 1
    except EngineCoreStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    names = args.served_model_name or [args.model]
    metrics = Metrics(names[0])
    llm = AsyncLLM(client, ready, model_config, tokenizer, metrics,
                   max_waiting=args.max_waiting_queue_length, stream_interval=interval)
    state = ServerState(llm=llm, model_names=names, model_dir=path, metrics=metrics,
                        api_key=args.api_key, chat_template=template,
                        special_tokens=chat_utils.special_tokens(path),
                        max_model_len=ready.max_model_len, created=int(time.time()))
    if template is None:
        logger.warning("%s has no chat template: /v1/chat/completions will answer 400", path)
    logger.info("engine ready in %.1f s, warm-up %.2f s of it (%s, max_model_len %d, "
                "%d KV blocks of %d tokens)", time.perf_counter() - t0, ready.warm_up_s,
                ready.dtype, ready.max_model_len, ready.num_blocks, ready.block_size)
    app = build_app(state)
    # the start-up heap (FastAPI, the tokenizer, pydantic's models) lives until
    # exit: an oldest-generation collection that walks it is a pause mid-stream
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(app, host=args.host, port=args.port,
                            log_level=args.uvicorn_log_level, access_log=False,
                            timeout_graceful_shutdown=GRACEFUL_S)
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
        return asyncio.run(_serve(server, llm, listener))
    finally:
        gc.unfreeze()  # a caller in the same process (tests) gets its heap back


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
