"""The engine core in a process of its own (upstream V1's EngineCoreProc):
it loads the model, says it is ready, then steps in a busy loop, reading the
front ends' requests between steps from ZMQ and sending each step's outputs
back. Nothing a request carries (text, a chat template, a large body) is
handled here, so no request can hold a step back, and no step holds back
the API server's event loop.

Messages: to the core, [RequestType, msgpack payload] frames on one PULL
socket connected to every API server's address; from it, EngineCoreOutputs
on one PUSH socket per API server (the handshake first)."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import msgspec
import zmq

from engine.core.chunk_sizer import PromptChunkSizer
from engine.core.messages import (
    EngineCoreFailed,
    EngineCoreOutputs,
    EngineCoreReady,
    EngineCoreRequest,
    RequestType,
)
from engine.logger import init_logging

logger = logging.getLogger("engine")

HEALTH_POLL_S = 1.0  # an idle core checks its ranks (and that its server lives) this often
WARM_UP_TOKENS = 4


@dataclass(frozen=True)
class CoreAddresses:
    """ZMQ addresses the API servers bind: one input and one output each."""

    inputs: list[str]
    outputs: list[str]
    cpu_share: str = ""  # the API servers' heavy jobs (engine/core/cpu_share.py)


class EngineCoreProc:
    def __init__(self, core, ctx: zmq.Context, addresses: CoreAddresses,
                 out_sockets: list | None = None, size_chunks: bool = True,
                 parent_pid: int | None = None):
        """size_chunks: cap a long prompt's chunk to a step time (the
        server's running streams keep a step every ~0.1 s; offline keeps the
        whole budget)."""
        self.core = core
        self.input = ctx.socket(zmq.PULL)
        for address in addresses.inputs:
            self.input.connect(address)
        self.outputs = out_sockets if out_sockets is not None else connect_outputs(ctx, addresses)
        self.requests = msgspec.msgpack.Decoder(EngineCoreRequest)
        self.ids = msgspec.msgpack.Decoder(list[str])
        self.encoder = msgspec.msgpack.Encoder()
        self.clients: dict[str, int] = {}  # request id -> the API server that hears it
        self.parent_pid = parent_pid
        self.stopped = False
        self.team = _team_size(core, addresses)
        self.chunks = None
        scheduler = getattr(core, "scheduler", None)  # -dp: the replicas size their own
        if scheduler is not None and size_chunks and scheduler.enable_chunked_prefill:
            self.chunks = PromptChunkSizer(scheduler.max_num_batched_tokens)
            scheduler.prompt_tokens_cap = self.chunks.cap()

    def run_busy_loop(self) -> None:
        """Until a front end says stop, or a part of the engine died
        (RankDiedError, raised after every front end was told)."""
        from engine.distributed.parallel_state import RankDiedError

        core = self.core
        try:
            while not self.stopped:
                self._read_requests(block=not core.has_unfinished())
                if core.has_unfinished() and not self.stopped:
                    self._step()
        except Exception as exc:  # every front end hears of it, then the core exits
            line = str(exc) if isinstance(exc, RankDiedError) else \
                f"the engine core failed: {type(exc).__name__}: {exc}".splitlines()[0]
            if not isinstance(exc, RankDiedError):
                logger.exception("engine core loop failed")
            self._send_all(EngineCoreOutputs(engine_dead=line, timestamp=time.monotonic()))
            raise

    def _read_requests(self, block: bool) -> None:
        if block:
            while not self.input.poll(int(HEALTH_POLL_S * 1000)):
                self.core.check_health()  # a rank that died while idle is heard of here
                if self.parent_pid is not None and os.getppid() != self.parent_pid:
                    logger.error("the API server went away; the engine core stops")
                    self.stopped = True
                    return
        while True:
            try:
                kind, payload = self.input.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            kind = bytes(kind.buffer)
            if kind == RequestType.ADD.value:
                self._add(self.requests.decode(payload.buffer))
            elif kind == RequestType.ABORT.value:
                ids = self.ids.decode(payload.buffer)
                self.core.abort_requests(ids)
                for request_id in ids:
                    self.clients.pop(request_id, None)
                if not self.core.has_unfinished():  # no step will carry the news: /metrics
                    self._send_all(EngineCoreOutputs(scheduler_stats=self.core.make_stats(),
                                                     timestamp=time.monotonic()))
            elif kind == RequestType.SHUTDOWN.value:
                self.stopped = True
                return

    def _add(self, req: EngineCoreRequest) -> None:
        self.clients[req.request_id] = req.client_index
        try:
            self.core.add_request(req)
        except ValueError as exc:  # the front end checks first: this is its bug, not a crash
            logger.error("refused request %s: %s", req.request_id, exc)
            self._send(EngineCoreOutputs(failed_request_ids=[req.request_id], failure=str(exc)))

    def _step(self) -> None:
        from engine.distributed.parallel_state import RankDiedError

        core = self.core
        if self.team is not None:
            self.team.adjust()
        t0 = time.perf_counter()
        try:
            out = core.step()
        except RankDiedError:
            raise
        except Exception as exc:  # noqa: BLE001 - fail the step's requests, not the engine
            logger.exception("a step failed; its requests fail, the engine goes on")
            failed = list(core.last_scheduled or core.requests)
            core.abort_requests(failed)
            out = EngineCoreOutputs(failed_request_ids=failed,
                                    failure=f"{type(exc).__name__}: {exc}".splitlines()[0],
                                    scheduler_stats=core.make_stats())
        took = time.perf_counter() - t0
        if self.chunks is not None and core.last_output is not None:
            self.chunks.stepped(core.last_output.num_prompt_tokens, took)
            core.scheduler.prompt_tokens_cap = self.chunks.cap()
        out.timestamp = time.monotonic()
        if core.last_output is None and not out.outputs and not out.failed_request_ids:
            return  # a wait for compiling grammars: nothing to tell
        self._send(out)

    def _send(self, out: EngineCoreOutputs) -> None:
        if len(self.outputs) == 1:
            self.outputs[0].send(self.encoder.encode(out), copy=False)
        else:  # each API server hears of its own requests; every one gets the stats
            by_client: dict[int, list] = {i: [] for i in range(len(self.outputs))}
            for o in out.outputs:
                by_client[self.clients.get(o.request_id, 0)].append(o)
            failed: dict[int, list] = {i: [] for i in range(len(self.outputs))}
            for request_id in out.failed_request_ids:
                failed[self.clients.get(request_id, 0)].append(request_id)
            for i, sock in enumerate(self.outputs):
                part = msgspec.structs.replace(out, outputs=by_client[i],
                                               failed_request_ids=failed[i])
                sock.send(self.encoder.encode(part), copy=False)
        for o in out.outputs:
            if o.finish_reason is not None:
                self.clients.pop(o.request_id, None)
        for request_id in out.failed_request_ids:
            self.clients.pop(request_id, None)

    def _send_all(self, out: EngineCoreOutputs) -> None:
        for sock in self.outputs:
            sock.send(self.encoder.encode(out))


def connect_outputs(ctx: zmq.Context, addresses: CoreAddresses) -> list:
    socks = []
    for address in addresses.outputs:
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 2000)  # the last outputs still leave at exit
        sock.connect(address)
        socks.append(sock)
    return socks


def ready_message(core, warm_up_s: float) -> EngineCoreReady:
    """What the core tells its API servers once loaded (-dp: every replica's
    blocks together)."""
    c = core.engine_config
    return EngineCoreReady(core.max_model_len, c.num_blocks * c.data_parallel_size,
                           c.block_size, str(core.dtype).replace("torch.", ""),
                           c.max_num_batched_tokens, warm_up_s,
                           list(c.pooler.tasks) if c.pooler is not None else [])


def warm_up(core) -> float:
    """A short prefill and a few batched decode steps, greedy and sampled,
    before the server says ready: the first requests then find the kernels
    chosen, the weights packed and the allocator grown (seconds, not
    minutes). The seconds it took."""
    from engine.sampling_params import SamplingParams

    t0 = time.perf_counter()
    vocab = core.config.vocab_size
    ids = [3 + i % max(vocab - 3, 1) for i in range(min(48, max(1, core.max_model_len // 2)))]
    steps = min(WARM_UP_TOKENS, core.max_model_len - len(ids) - 1)
    pooler = core.engine_config.pooler
    if pooler is not None:  # a pooling engine: a batch of two lengths, one step
        from engine.pooling_params import PoolingParams

        for i in range(2):
            core.add_request(EngineCoreRequest(f"warm-up-{i}", ids[:len(ids) - 4 * i] or ids,
                                               None, pooling_params=PoolingParams(
                                                   task=pooler.tasks[0])))
        steps = 0
        while core.has_unfinished():
            core.step()
    if steps >= 1:
        for i, temperature in enumerate((0.0, 1.0)):
            params = SamplingParams(temperature=temperature, seed=0, max_tokens=steps,
                                    ignore_eos=True)
            core.add_request(EngineCoreRequest(f"warm-up-{i}", ids[:len(ids) - 4 * i] or ids,
                                               params))
        while core.has_unfinished():
            core.step()
    return time.perf_counter() - t0


def _team_size(core, addresses: CoreAddresses):
    """The OpenMP team the API servers' heavy jobs resize, when the model runs
    in this process (its ranks in processes of their own keep theirs)."""
    from engine.executor.uniproc_executor import UniProcExecutor

    if not addresses.cpu_share or not isinstance(getattr(core, "executor", None),
                                                 UniProcExecutor):
        return None
    import torch

    from engine.core.cpu_share import TeamSize

    return TeamSize(addresses.cpu_share, torch.get_num_threads(), torch.set_num_threads)


def run_engine_core(model: str, dtype: str, engine_args: dict, addresses: CoreAddresses,
                    parent_pid: int, log_level: int = logging.INFO) -> None:
    """The engine core process's main (spawned by engine/core/core_client.py)."""
    # Ctrl-C reaches the whole process group: the API server decides, and tells us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    init_logging(log_level, "%(levelname)s engine core: %(message)s", sys.stderr)
    ctx = zmq.Context()
    outputs = connect_outputs(ctx, addresses)
    encoder = msgspec.msgpack.Encoder()
    core = None
    code = 0
    try:
        from engine.executor.data_parallel import engine_core

        core = engine_core(model, dtype, **engine_args)
        ready = ready_message(core, warm_up(core))
    except Exception as exc:  # noqa: BLE001 - the server prints the one line and exits
        line = f"{exc}".splitlines()[0] if isinstance(exc, ValueError) else \
            f"{type(exc).__name__}: {exc}".splitlines()[0]
        for sock in outputs:
            sock.send(encoder.encode(EngineCoreFailed(line)))
        _close(ctx, core)
        os._exit(1)
    for sock in outputs:
        sock.send(encoder.encode(ready))
    try:
        EngineCoreProc(core, ctx, addresses, outputs, parent_pid=parent_pid).run_busy_loop()
    except SystemExit:
        pass
    except Exception as exc:  # noqa: BLE001 - the front ends were told; one line here
        logger.error("engine core stopped: %s", exc)
        code = 1
    _close(ctx, core)
    os._exit(code)  # gloo's and the executor's threads must not keep the core alive


def _exit_on_signal(signum, frame) -> None:
    # Python runs a handler wherever the main thread is, finalizers included:
    # raised inside one (zmq's Socket.__del__, once in a test), SystemExit is
    # "ignored" with a traceback on stderr and the core runs on. There, the
    # signal is sent again a moment later, once the finalizer has returned.
    f = frame
    while f is not None:
        if f.f_code.co_name == "__del__":
            threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
            return
        f = f.f_back
    raise SystemExit(0)


def _close(ctx, core) -> None:
    try:
        if core is not None:
            core.shutdown()
    finally:
        ctx.destroy(linger=2000)
