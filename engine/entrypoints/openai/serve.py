"""Start the server: load the engine, then serve on uvicorn until stopped."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import sys
import time

logger = logging.getLogger("engine")


def serve(args) -> int:
    import uvicorn

    from engine.core.async_llm import AsyncLLM
    from engine.core.engine_core import EngineCore
    from engine.entrypoints import chat_utils
    from engine.entrypoints.openai.api_server import ServerState, build_app
    from engine.entrypoints.openai.metrics import Metrics
    from engine.entrypoints.openai.stream_pacer import parse_interval

    interval = parse_interval(args.stream_interval)  # before the model loads: bad input fails fast
    listener = _listen(args.host, args.port)  # a busy port, too, before minutes of loading
    if listener is None:
        return 1

    t0 = time.perf_counter()
    core = EngineCore(args.model, args.dtype, block_size=args.block_size,
                      max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens,
                      max_model_len=args.max_model_len)
    names = args.served_model_name or [args.model]
    template = chat_utils.load_template(core.path, args.chat_template)
    metrics = Metrics(names[0])
    llm = AsyncLLM(core, metrics, stream_interval=interval)
    state = ServerState(llm=llm, model_names=names, model_dir=core.path, metrics=metrics,
                        api_key=args.api_key, chat_template=template,
                        special_tokens=chat_utils.special_tokens(core.path),
                        max_model_len=core.max_model_len, created=int(time.time()))
    if template is None:
        logger.warning("%s has no chat template: /v1/chat/completions will answer 400",
                       core.path)
    logger.info("engine ready in %.1f s (%s, max_model_len %d, %d KV blocks of %d tokens)",
                time.perf_counter() - t0, core.dtype, core.max_model_len, core.blocks.num_blocks,
                core.blocks.block_size)
    app = build_app(state)
    # as upstream's EngineCore: the start-up heap (torch, the model, FastAPI) is
    # hundreds of thousands of objects that live until exit, and every oldest-
    # generation collection walked them all, a pause of ~0.25 s mid-stream
    gc.collect()
    gc.freeze()
    config = uvicorn.Config(app, host=args.host, port=args.port,
                            log_level=args.uvicorn_log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    def stop(signum, frame) -> None:
        # uvicorn replaces this while it serves, and calls it again on the way out
        # (it re-raises the signals it caught): Python's own handlers would then
        # end the process with a traceback (SIGINT) or status -15 (SIGTERM)
        server.force_exit = server.should_exit
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
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
    """uvicorn and the engine's step loop in this thread's event loop (AsyncLLM.run
    says why): a request under way when the server stops still ends."""
    steps = asyncio.ensure_future(llm.run())
    try:
        await server.serve(sockets=[listener])
    except SystemExit:  # uvicorn exits (3) when it cannot bind; it logged why
        return 1
    finally:
        llm.shutdown()
        await steps
    return 0 if server.started else 1
