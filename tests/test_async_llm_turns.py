"""The engine steps inside the server's event loop; after a long step (a
prompt's chunk) the loop gets enough turns for a new HTTP request to be
accepted, read and answered before the next step, not one stage per step."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import SimpleNamespace

from engine.core import async_llm
from engine.core.async_llm import AsyncLLM


class SlowCore:
    """Stands in for EngineCore: every step blocks the loop like a prompt's chunk."""

    def __init__(self, steps: int):
        self.left, self.done = steps, 0
        self.scheduler, self.last_scheduled, self.requests = SimpleNamespace(), [], {}

    def has_unfinished(self) -> bool:
        return self.left > 0

    def step(self) -> list:
        time.sleep(2 * async_llm.LONG_STEP_S)  # blocks the event loop, as a forward does
        self.left -= 1
        self.done += 1
        return []

    def check_health(self) -> None:
        pass


def test_a_request_is_answered_between_two_long_steps():
    core = SlowCore(steps=40)
    llm = AsyncLLM(core)
    seen: dict[str, int] = {}

    async def answer(reader, writer):
        await reader.readline()
        seen["answered"] = core.done
        writer.write(b"ok\n")
        await writer.drain()
        writer.close()

    def client(port: int) -> None:
        while core.done < 3:
            time.sleep(0.001)
        with socket.create_connection(("127.0.0.1", port)) as s:
            seen["sent"] = core.done
            s.sendall(b"health\n")
            assert s.makefile().readline() == "ok\n"

    async def main() -> None:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        thread = threading.Thread(target=client, args=(port,))
        thread.start()
        engine = asyncio.ensure_future(llm.run())
        while core.has_unfinished() or thread.is_alive():
            await asyncio.sleep(0.01)
        llm.shutdown()
        await engine
        thread.join()
        server.close()

    asyncio.run(main())
    # accepted, read and answered at most one step after the one it arrived in
    assert seen["answered"] - seen["sent"] <= 1, seen
