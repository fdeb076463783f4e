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
    from engine.engine_args import cli_engine_args
    from engine.entrypoints import chat_utils
    from engine.entrypoints.openai.api_server import ServerState, build_app
    from engine.entrypoints.openai.metrics import Metrics
    from engine.entrypoints.openai.stream_pacer import parse_interval
    from engine.executor.data_parallel import engine_core

    interval = parse_interval(args.stream_interval)  # before the model loads: bad input fails fast
    listener = _listen(args.host, args.port)  # a busy port, too, before minutes of loading
    if listener is None:
        return 1

    t0 = time.perf_counter()
    core = engine_core(args.model, args.dtype, **cli_engine_args(args))
    warm = warm_up(core)
    names = args.served_model_name or [args.model]
    template = chat_utils.load_template(core.path, args.chat_template)
    metrics = Metrics(names[0])
    llm = AsyncLLM(core, metrics, stream_interval=interval,
                   max_waiting=args.max_waiting_queue_length)
    state = ServerState(llm=llm, model_names=names, model_dir=core.path, metrics=metrics,
                        api_key=args.api_key, chat_template=template,
                        special_tokens=chat_utils.special_tokens(core.path),
                        max_model_len=core.max_model_len, created=int(time.time()))
    if template is None:
        logger.warning("%s has no chat template: /v1/chat/completions will answer 400",
                       core.path)
    logger.info("engine ready in %.1f s, warm-up %.2f s of it (%s, max_model_len %d, "
                "%d KV blocks of %d tokens)", time.perf_counter() - t0, warm, core.dtype,
                core.max_model_len, core.blocks.num_blocks, core.blocks.block_size)
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


def warm_up(core) -> float:
    """A short prefill and a few batched decode steps, greedy and sampled,
    before /health says 200: the first requests then find the kernels chosen,
    the weights packed and the allocator grown (seconds, not minutes: a few
    steps of the smallest shapes of each kind). The seconds it took."""
    from engine.sampling_params import SamplingParams

    t0 = time.perf_counter()
    ids = core.tokenizer.encode("warm up " * 16).ids[:max(1, core.max_model_len // 2)] or [0]
    steps = min(WARM_UP_TOKENS, core.max_model_len - len(ids) - 1)
    if steps >= 1:
        for i, temperature in enumerate((0.0, 1.0)):
            core.add(core.make_sequence(f"warm-up-{i}", ids[:len(ids) - 4 * i] or ids,
                                        SamplingParams(temperature=temperature, seed=0,
                                                       max_tokens=steps, ignore_eos=True)))
        while core.has_unfinished():
            core.step()
    return time.perf_counter() - t0


WARM_UP_TOKENS = 4


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
    steps.add_done_callback(lambda _: _stop_when_dead(server, llm))
    try:
        await server.serve(sockets=[listener])
    except SystemExit:  # uvicorn exits (3) when it cannot bind; it logged why
        return 1
    finally:
        llm.shutdown()
        await steps
    if llm.dead is not None:
        logger.error("the engine stopped: %s", llm.dead)
        return 1
    return 0 if server.started else 1


DEAD_GRACE_S = 3.0  # /health answers 503 this long before the server exits


def _stop_when_dead(server, llm) -> None:
    """As upstream: an engine that died (a tensor-parallel rank gone) takes the
    server down, after a moment in which /health says 503 and why."""
    if llm.dead is not None:
        asyncio.get_running_loop().call_later(DEAD_GRACE_S, setattr, server, "should_exit", True)
