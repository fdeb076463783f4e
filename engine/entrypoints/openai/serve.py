"""Start the server: load the engine, then serve on uvicorn until stopped."""
from __future__ import annotations

import logging
import signal
import threading
import time

logger = logging.getLogger("engine")


def serve(args) -> int:
    import uvicorn

    from engine.async_llm import AsyncLLM
    from engine.core import EngineCore
    from engine.entrypoints import chat_utils
    from engine.entrypoints.openai.api_server import ServerState, build_app
    from engine.entrypoints.openai.metrics import Metrics

    t0 = time.perf_counter()
    core = EngineCore(args.model, args.dtype, block_size=args.block_size,
                      max_num_seqs=args.max_num_seqs,
                      max_num_batched_tokens=args.max_num_batched_tokens,
                      max_model_len=args.max_model_len)
    names = args.served_model_name or [args.model]
    template = chat_utils.load_template(core.path, args.chat_template)
    metrics = Metrics(names[0])
    # The engine steps in this thread, which loaded the model (AsyncLLM.run says
    # why); uvicorn serves from a second one.
    llm = AsyncLLM(core, metrics, own_thread=False)
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
    config = uvicorn.Config(build_app(state), host=args.host, port=args.port,
                            log_level=args.uvicorn_log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    failed: list[BaseException] = []

    def http() -> None:
        try:
            server.run()
        except BaseException as exc:  # noqa: BLE001 - uvicorn exits 1 when it cannot bind
            failed.append(exc)
        finally:
            state.llm.shutdown()

    def stop(signum, frame) -> None:  # uvicorn installs its handlers only in the main thread
        server.force_exit = server.should_exit
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    web = threading.Thread(target=http, name="http", daemon=True)
    web.start()
    state.llm.run()  # until the server stops (or the engine fails: it then answers errors)
    while web.is_alive():
        web.join(0.5)
    if failed or not server.started:
        return 1
    return 0
