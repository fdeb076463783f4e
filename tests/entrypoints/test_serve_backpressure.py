"""Backpressure: the waiting queue has a bound (--max-waiting-queue-length);
a request past it is a 503 with Retry-After, one that could never fit is a
400 naming n or the prompt list. The app in process, over ASGI, on the tiny
model: the engine client does not read the core's outputs at first, so no
request hears of its first token and they pile up as waiting, then let go."""
from __future__ import annotations

import asyncio
import time

import pytest
from helpers import app_in_process

httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai (requirements/dev.txt)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def test_a_full_waiting_queue_answers_503_with_retry_after(tiny):
    app, llm = app_in_process(tiny, max_waiting=3)
    body = {"prompt": "one two three", "max_tokens": 3, "temperature": 0}

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t", timeout=60) as c:
            held = [asyncio.ensure_future(c.post("/v1/completions", json=body))
                    for _ in range(2)]
            held.append(asyncio.ensure_future(
                c.post("/v1/completions", json={**body, "stream": True})))
            # llm.run() does not read the core's outputs yet: no first token, they wait
            while llm.num_waiting() < 3:
                await asyncio.sleep(0.01)
            full = await c.post("/v1/completions", json=body)
            full_stream = await c.post("/v1/completions", json={**body, "stream": True})
            never = await c.post("/v1/completions", json={**body, "n": 4, "temperature": 1})
            many = await c.post("/v1/completions", json={**body, "prompt": ["a"] * 5})
            run = asyncio.ensure_future(llm.run())  # now hear the core's outputs
            answered = await asyncio.gather(*held)
            after = await c.post("/v1/completions", json=body)
            llm.shutdown()
            await run
            return full, full_stream, never, many, answered, after

    full, full_stream, never, many, answered, after = asyncio.run(main())
    for r in (full, full_stream):
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        err = r.json()["error"]
        assert err["type"] == "ServiceUnavailable" and "\n" not in err["message"]
        assert "3 sequences are waiting to run" in err["message"], err
    assert never.status_code == 400 and never.json()["error"]["param"] == "n"
    assert "queues at most 3" in never.json()["error"]["message"]
    assert many.status_code == 400 and many.json()["error"]["param"] == "prompt"
    assert [r.status_code for r in answered] == [200, 200, 200]
    assert answered[2].text.rstrip().endswith("data: [DONE]")
    assert after.status_code == 200
    assert llm.num_waiting() == 0 and llm.num_requests() == 0 and not llm._unread
    assert not llm.core.requests and not llm.core.has_unfinished()
    assert llm.core.blocks.num_free == llm.core.blocks.num_blocks


def test_a_stream_never_read_is_released(tiny):
    """A streamed answer whose body never runs (its client left before it
    began) aborts its sequences: nothing stays queued or running."""
    import threading

    from starlette.requests import ClientDisconnect

    from engine.core.sequence import RequestStatus
    from engine.entrypoints.openai.serving_engine import sse
    from engine.sampling_params import SamplingParams

    app, llm = app_in_process(tiny, max_waiting=8)
    state = app.state.s
    core = llm.core
    # the core's first step waits until the abort is on its way: the request
    # cannot have finished by itself (the core is idle until a request comes)
    gate, execute = threading.Event(), core.executor.execute_model

    def held(seqs, is_prefill):
        assert gate.wait(30)
        return execute(seqs, is_prefill)

    core.executor.execute_model = held

    async def main():
        seqs = [await llm.make_request("one two", SamplingParams(max_tokens=200,
                                                                  ignore_eos=True))]
        llm.add(seqs)
        assert llm.num_waiting() == 1
        while seqs[0].request_id not in core.requests:
            await asyncio.sleep(0.01)
        in_core = core.requests[seqs[0].request_id]

        async def chunks():
            yield {}

        response = sse(chunks(), state, seqs)

        async def receive():
            return {"type": "http.disconnect"}

        async def send(message):
            raise OSError("the client is gone")

        with pytest.raises(ClientDisconnect):
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
        front = llm.num_waiting(), llm.num_requests(), dict(llm.output.requests), set(llm._unread)
        if llm._abort_task is not None:
            await llm._abort_task  # the abort reaches the core's socket
        # and its queue (ZMQ delivers in its own thread): then the core reads it right
        # after the held step, instead of stepping on while it is in flight
        await asyncio.sleep(0.3)
        gate.set()
        for _ in range(500):  # the core reads it after the step under way
            if not core.has_unfinished():
                break
            await asyncio.sleep(0.01)
        llm.shutdown()
        return front, in_core

    front, in_core = asyncio.run(main())
    assert front == (0, 0, {}, set())  # released before anything read it
    assert in_core.status == RequestStatus.FINISHED_ABORTED and in_core.num_output_tokens <= 1
    assert not core.requests and not core.has_unfinished()
    assert core.blocks.num_free == core.blocks.num_blocks


def test_the_flag_is_checked_before_loading(capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "/nonexistent", "--max-waiting-queue-length", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-waiting-queue-length: must be a positive integer, got '0'" in err


def test_a_dead_engine_core_ends_its_requests_and_answers_503(tiny):
    """A core whose loop stops (a rank died) tells the front end: the request
    under way ends with the cause, /health and every new request are a 503
    naming it (a new request is refused before anything is queued)."""
    import threading

    from engine.distributed.parallel_state import RankDiedError

    app, llm = app_in_process(tiny)
    core = llm.core
    gate, step = threading.Event(), core.step

    def dies():
        assert gate.wait(30)
        raise RankDiedError("tensor-parallel rank 1 died (signal SIGKILL)")

    core.step = dies  # the core is idle: no step has begun
    body = {"prompt": "one two", "max_tokens": 4, "temperature": 0}

    async def main():
        reader = asyncio.ensure_future(llm.run())
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://t", timeout=60) as c:
                before = await c.get("/health")
                under_way = asyncio.ensure_future(c.post("/v1/completions", json=body))
                while not core.requests:
                    await asyncio.sleep(0.01)
                gate.set()
                ended = await under_way
                health = await c.get("/health")
                refused = await c.post("/v1/completions", json=body)
                refused_stream = await c.post("/v1/completions", json={**body, "stream": True})
                return before, ended, health, refused, refused_stream
        finally:
            core.step = step
            llm.shutdown()
            await asyncio.wait_for(reader, 30)

    before, ended, health, refused, refused_stream = asyncio.run(main())
    assert before.status_code == 200
    assert llm.dead is not None and "tensor-parallel rank 1 died" in llm.dead
    assert ended.status_code == 500, ended.text  # it was admitted: the engine failed it
    assert "tensor-parallel rank 1 died" in ended.json()["error"]["message"], ended.text
    for r in (health, refused, refused_stream):
        assert r.status_code == 503, r.text
        assert "tensor-parallel rank 1 died" in r.json()["error"]["message"], r.text
    assert llm.num_requests() == 0
