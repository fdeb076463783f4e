"""The API server's link to the engine core (upstream V1's AsyncMPClient):
it starts the core process, binds the two ZMQ sockets the core connects to
(in a folder only this user can enter), sends requests and aborts, and
reads the core's outputs. A core that dies, however it dies (kill -9
included), is noticed at once through its process sentinel."""
from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from engine.core.engine_core_proc import CoreAddresses, EngineCoreProc, run_engine_core
from engine.core.messages import (
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    Handshake,
    RequestType,
)

logger = logging.getLogger("engine")

STOP_GRACE_S = 3.0  # a core asked to stop gets this long before it is killed
# ... while it loads: it holds nothing to save, and its SIGTERM waits for the
# C call it is in (a shard being read, a warm-up step); Ctrl-C answers in 1 s
LOADING_STOP_GRACE_S = 0.5
DRAIN_BATCH = 64  # core messages handled before other callbacks get a turn


class EngineCoreStartError(RuntimeError):
    """The core could not load the model (its one line), or died doing so."""


class Interrupted(RuntimeError):
    """SIGINT or SIGTERM while the core was loading: it was stopped."""


def ipc_addresses(folder: str, clients: int) -> CoreAddresses:
    from engine.core import cpu_share

    return CoreAddresses([f"ipc://{folder}/in-{i}" for i in range(clients)],
                         [f"ipc://{folder}/out-{i}" for i in range(clients)],
                         cpu_share.create(f"{folder}/cpu-share", clients))


class CoreProcess:
    """The engine core's process (or, for tests, a thread in this one) and
    the private folder its sockets live in."""

    def __init__(self, model: str, dtype: str, engine_args: dict, clients: int = 1):
        self.folder = tempfile.mkdtemp(prefix="vllm-engine-")  # 0700: no one else connects
        self.addresses = ipc_addresses(self.folder, clients)
        self.model, self.dtype, self.engine_args = model, dtype, engine_args
        self.proc: mp.process.BaseProcess | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        # not a daemon: the core starts processes of its own (-tp ranks, -dp replicas)
        self.proc = ctx.Process(target=run_engine_core, name="EngineCore",
                                args=(self.model, self.dtype, self.engine_args, self.addresses,
                                      os.getpid(), logging.getLogger("engine").level or
                                      logging.INFO))
        from engine.spawn import main_not_rerun

        with main_not_rerun():
            self.proc.start()

    owns = True  # its client stops it

    def sentinel(self) -> int | None:
        """A file descriptor that turns readable when the core exits."""
        return self.proc.sentinel if self.proc is not None else None

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.is_alive()
        return self.thread is not None and self.thread.is_alive()

    def stopped_cleanly(self) -> bool:
        """It exited 0: told to stop (SIGTERM to the whole process group, as
        systemd and a terminal's kill send), not a crash."""
        return self.proc is not None and self.proc.exitcode == 0

    def how_it_ended(self) -> str:
        if self.proc is None:
            return "the engine core thread stopped"
        self.proc.join(1)
        code = self.proc.exitcode
        if code == 0:
            return "the engine core process was stopped (SIGTERM)"
        if code is not None and code < 0:
            try:
                return f"the engine core process died (signal {signal.Signals(-code).name})"
            except ValueError:
                pass
        return f"the engine core process died (exit code {code})"

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.terminate()  # SIGTERM: the core shuts its ranks down
            self.proc.join(grace_s)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        if self.thread is not None:
            self.thread.join(STOP_GRACE_S)
        shutil.rmtree(self.folder, ignore_errors=True)


class SharedCore:
    """An engine core another process started and stops (the parent of
    --api-server-count N): this API server is one of its N clients."""

    owns = False

    def __init__(self, addresses: CoreAddresses, pid: int):
        self.addresses, self.pid = addresses, pid
        self.proc = None
        self._fd: int | None = None

    def sentinel(self) -> int:
        if self._fd is None:  # pidfd: readable once the process exits, though not our child
            self._fd = os.pidfd_open(self.pid)
        return self._fd

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stopped_cleanly(self) -> bool:
        return False

    def how_it_ended(self) -> str:
        return f"the engine core process (pid {self.pid}) died"

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        pass


class AsyncMPClient:
    """Requests to the core and its outputs back, on this event loop's
    sockets (bound here, before the core connects)."""

    def __init__(self, core: CoreProcess | SharedCore, client_index: int = 0):
        self.core, self.client_index = core, client_index
        self.ctx = zmq.asyncio.Context()
        self.input = self.ctx.socket(zmq.PUSH)
        self.input.setsockopt(zmq.LINGER, 0)
        self.input.bind(core.addresses.inputs[client_index])
        self.output = self.ctx.socket(zmq.PULL)
        self.output.setsockopt(zmq.LINGER, 0)
        self.output.bind(core.addresses.outputs[client_index])
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(EngineCoreOutputs)
        self._stop_reading: Callable[[], None] = lambda: None

    def wait_ready(self, interrupted=lambda: False) -> EngineCoreReady:
        """Block until the core says it is ready (EngineCoreStartError when it
        cannot start; Interrupted when interrupted() turns true meanwhile)."""
        sync: zmq.Socket = zmq.Socket.shadow(self.output.underlying)
        while not sync.poll(100):
            if interrupted():
                raise Interrupted("stopped while the engine core was loading the model")
            if not self.core.alive():
                raise EngineCoreStartError(f"{self.core.how_it_ended()} while loading the model")
        msg = msgspec.msgpack.decode(sync.recv(), type=Handshake)
        if not isinstance(msg, EngineCoreReady):
            raise EngineCoreStartError(msg.error)
        return msg

    def send_request(self, req: EngineCoreRequest) -> None:
        """Queue a request for the core (zmq keeps the order of sends)."""
        self.input.send_multipart((RequestType.ADD.value, self.encoder.encode(req)), copy=False)

    async def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            await self.input.send_multipart((RequestType.ABORT.value,
                                             self.encoder.encode(request_ids)))

    def on_outputs(self, handle: Callable[[EngineCoreOutputs], None]) -> asyncio.Future:
        """Call handle(outputs) for each message the core sends, from the
        event loop's reader callback, until the returned future is cancelled;
        it fails with the first message that cannot be decoded or handled.
        pyzmq's asyncio recv costs a future, a task wake-up and its poller's
        bookkeeping per message: ~17% of the API server's thread at one client."""
        loop = asyncio.get_running_loop()
        sock: zmq.Socket = zmq.Socket.shadow(self.output.underlying)
        fd = int(sock.getsockopt(zmq.FD))
        done: asyncio.Future = loop.create_future()

        def drain() -> None:
            if done.done():
                return
            try:
                # zmq's FD is edge-triggered: it is readable again only after
                # EVENTS says nothing is left, so stop only there (or yield to
                # the loop and come back: a burst must not starve requests)
                for _ in range(DRAIN_BATCH):
                    if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                        return
                    handle(self.decoder.decode(sock.recv(zmq.NOBLOCK, copy=False).buffer))
                loop.call_soon(drain)
            except Exception as exc:  # noqa: BLE001 - the caller decides what it means
                done.set_exception(exc)

        def stop() -> None:
            done.cancel()  # a drain already queued then does nothing
            if not loop.is_closed():
                loop.remove_reader(fd)

        loop.add_reader(fd, drain)
        # a cancelled future runs its callbacks a loop turn later: shutdown()
        # takes the reader off first, before the socket (and its FD) closes
        done.add_done_callback(lambda _: stop())
        self._stop_reading = stop
        loop.call_soon(drain)  # what came before the reader was registered
        return done

    def shutdown(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the core (when this client owns it) and close the sockets; again: nothing."""
        if self.ctx.closed:
            return
        self._stop_reading()
        if not self.core.owns:  # the other API servers still use it
            self.ctx.destroy(linger=0)
            return
        try:  # a plain socket's send: the asyncio one would hand its error to a future
            zmq.Socket.shadow(self.input.underlying).send_multipart(
                (RequestType.SHUTDOWN.value, b""), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the core is gone, or never connected: stop() ends it either way
        self.core.stop(grace_s)
        self.ctx.destroy(linger=0)


def core_in_thread(core, clients: int = 1) -> CoreProcess:
    """An engine core already built in this process, stepped by a thread of
    its own behind the same sockets (tests: they reach into the core)."""
    proc = CoreProcess(str(core.path), "", {}, clients)
    ctx: zmq.Context = zmq.Context.instance()

    def main():
        from engine.core.engine_core_proc import connect_outputs, ready_message

        outputs = connect_outputs(ctx, proc.addresses)
        ready = ready_message(core, 0.0)
        for sock in outputs:
            sock.send(msgspec.msgpack.encode(ready))
        loop = EngineCoreProc(core, ctx, proc.addresses, outputs)
        try:
            loop.run_busy_loop()
        except Exception:  # noqa: BLE001 - the front end was told (engine_dead)
            pass
        finally:
            loop.input.close(linger=0)
            for sock in outputs:
                sock.close(linger=1000)

    proc.thread = threading.Thread(target=main, name="EngineCore", daemon=True)
    proc.thread.start()
    time.sleep(0)
    return proc
