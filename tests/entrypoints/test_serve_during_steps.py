"""The engine core steps outside the server's event loop (its own process in
`engine serve`, a thread here): however long a step takes (a prompt's chunk on
a large model), /health, /metrics and the front end's own work (tokenizing)
are answered during it, not after it. (Replaces the old test of the HTTP turns
the event loop got between two steps when the core stepped inside it.)"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from helpers import app_in_process

httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai (requirements/dev.txt)")

STEP_S = 0.3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from engine.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny")


def test_health_and_the_front_end_answer_during_a_slow_step(tiny):
    app, llm = app_in_process(tiny)
    core = llm.core
    in_step = threading.Event()
    steps: list[tuple[float, float]] = []
    execute = core.executor.execute_model

    def slow(seqs, is_prefill):  # every step as long as a long prompt's chunk
        t0 = time.monotonic()
        in_step.set()
        time.sleep(STEP_S)
        try:
            return execute(seqs, is_prefill)
        finally:
            in_step.clear()
            steps.append((t0, time.monotonic()))

    core.executor.execute_model = slow  # the core is idle: no step has begun

    async def main():
        reader = asyncio.ensure_future(llm.run())
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                         base_url="http://t", timeout=60) as c:
                work = asyncio.ensure_future(c.post("/v1/completions", json={
                    "prompt": "one two", "max_tokens": 6, "temperature": 0,
                    "ignore_eos": True}))
                probes = []
                while not work.done():
                    if not in_step.is_set():
                        await asyncio.sleep(0.005)
                        continue
                    t0 = time.monotonic()
                    health = await c.get("/health")
                    tokens = await c.post("/tokenize", json={"prompt": "one two three"})
                    metrics = await c.get("/metrics")
                    t1 = time.monotonic()
                    probes.append((t0, t1, health.status_code, tokens.status_code,
                                   metrics.status_code))
                    await asyncio.sleep(0.05)
                return probes, await work
        finally:
            llm.shutdown()
            await asyncio.wait_for(reader, 30)

    probes, work = asyncio.run(main())
    assert work.status_code == 200, work.text
    assert work.json()["usage"]["completion_tokens"] == 6
    assert len(steps) == 6 and len(probes) >= 6, (steps, probes)
    assert all(p[2:] == (200, 200, 200) for p in probes), probes
    # answered during the step it came in (begun and answered inside one step), not after it
    during = [(t0, t1) for t0, t1, *_ in probes
              if any(s0 <= t0 and t1 <= s1 for s0, s1 in steps)]
    assert len(during) >= len(probes) // 2, (steps, probes)
