"""The API server's reading of the engine core's outputs (AsyncMPClient.
on_outputs): every message, in order, whether it came before the reader was
registered, in a burst larger than one drain, or trickling in; a message
that cannot be decoded fails the reader instead of being skipped."""
from __future__ import annotations

import asyncio
import shutil
import tempfile

import msgspec
import pytest
import zmq

from engine.core import core_client
from engine.core.core_client import AsyncMPClient, SharedCore, ipc_addresses
from engine.core.messages import EngineCoreOutputs


@pytest.fixture
def link():
    folder = tempfile.mkdtemp()
    client = AsyncMPClient(SharedCore(ipc_addresses(folder, 1), pid=0))
    core = zmq.Context().socket(zmq.PUSH)
    core.connect(client.core.addresses.outputs[0])
    yield client, core
    core.close(linger=0)
    client.shutdown()
    shutil.rmtree(folder, ignore_errors=True)


def _send(core, first: int, count: int) -> None:
    for i in range(first, first + count):
        core.send(msgspec.msgpack.encode(EngineCoreOutputs(timestamp=float(i))))


async def _collect(client, core, before: int, after: int, trickle: int) -> list[float]:
    seen: list[float] = []
    _send(core, 0, before)
    await asyncio.sleep(0.05)  # queued in zmq before anyone reads
    # as wait_ready's poll does: the edge-triggered FD is now quiet though messages wait
    zmq.Socket.shadow(client.output.underlying).getsockopt(zmq.EVENTS)
    reading = client.on_outputs(lambda outs: seen.append(outs.timestamp))
    _send(core, before, after)  # a burst: more than one drain's batch
    for i in range(trickle):  # one at a time, each after the reader went idle
        await asyncio.sleep(0.005)
        _send(core, before + after + i, 1)
    total = before + after + trickle
    for _ in range(400):
        if len(seen) == total:
            break
        await asyncio.sleep(0.005)
    reading.cancel()
    return seen


def test_every_message_in_order(link):
    client, core = link
    before, after = 5, 3 * core_client.DRAIN_BATCH + 7
    seen = asyncio.run(_collect(client, core, before, after, trickle=20))
    assert seen == [float(i) for i in range(before + after + 20)]


def test_messages_queued_before_the_reader_are_read_without_another(link):
    client, core = link
    assert asyncio.run(_collect(client, core, 5, 0, trickle=0)) == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_message_that_cannot_be_decoded_fails_the_reader(link):
    client, core = link

    async def main():
        reading = client.on_outputs(lambda outs: None)
        core.send(b"\xc1 not msgpack")
        return await asyncio.wait_for(reading, 5)

    with pytest.raises(msgspec.DecodeError):
        asyncio.run(main())


def test_shutdown_takes_the_reader_off_before_the_socket_closes(link):
    """The loop must not keep watching a closed FD (a number the next socket reuses)."""
    client, _ = link

    async def main():
        loop = asyncio.get_running_loop()
        fd = int(zmq.Socket.shadow(client.output.underlying).getsockopt(zmq.FD))
        client.on_outputs(lambda outs: None)
        client.shutdown()
        return loop.remove_reader(fd)  # True had it still been registered

    assert asyncio.run(main()) is False
