"""Start the server: load the engine, then serve on uvicorn until stopped."""
from __future__ import annotations

import logging
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
    state = ServerState(llm=AsyncLLM(core, metrics), model_names=names, model_dir=core.path,
                        metrics=metrics, api_key=args.api_key, chat_template=template,
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
    try:
        uvicorn.Server(config).run()
    finally:
        state.llm.shutdown()
    return 0
