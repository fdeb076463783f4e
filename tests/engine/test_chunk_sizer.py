"""The server's prompt chunks: sized to a step time from the measured prefill
speed (engine/core/chunk_sizer.py), applied by the scheduler to each prompt's
chunk, never to the running decodes nor to how many prompts a step admits."""
from __future__ import annotations

from test_scheduler import BS, seq, step

from engine.core import chunk_sizer
from engine.core.chunk_sizer import PromptChunkSizer
from engine.core.kv_cache_manager import BlockManager
from engine.core.scheduler import Scheduler


def test_cap_follows_the_measured_speed():
    sizer = PromptChunkSizer(budget=2048)
    assert sizer.cap() == chunk_sizer.START_TOKENS  # nothing measured yet
    sizer.stepped(1000, 0.5)  # 2000 tokens a second
    assert sizer.cap() == int(2000 * chunk_sizer.STEP_TARGET_S)
    sizer.stepped(1000, 0.25)  # smoothed with the 4000 a second of this step
    assert sizer.cap() == int(3000 * chunk_sizer.STEP_TARGET_S)
    sizer.stepped(5, 1.0)  # decodes alone say nothing about prompt speed
    assert sizer.cap() == int(3000 * chunk_sizer.STEP_TARGET_S)


def test_cap_stays_within_its_bounds():
    fast, slow = PromptChunkSizer(budget=2048), PromptChunkSizer(budget=2048)
    fast.stepped(2000, 0.001)
    assert fast.cap() == 2048  # never past max_num_batched_tokens
    slow.stepped(200, 100.0)
    assert slow.cap() == chunk_sizer.MIN_TOKENS
    assert PromptChunkSizer(budget=256).cap() == 256


def test_scheduler_caps_each_prompt_chunk_not_decodes():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=200,
                      enable_chunked_prefill=True)
    sched.prompt_tokens_cap = 30
    a, b, c, e = seq(10), seq(100, 1000), seq(50, 2000), seq(20, 4000)
    sched.add(a)
    assert step(sched) == [(a, 10, True)]
    sched.add(b)
    sched.add(c)
    # a decodes; b, the older of two prompts longer than the cap, gets the step's
    # chunk and c waits for it
    assert step(sched) == [(a, 1, True), (b, 30, False)]
    sched.prompt_tokens_cap = 80
    sched.add(e)
    # b's last 70 and c's 50 both fit the cap now: whole; e too, never held back
    assert step(sched) == [(a, 1, True), (b, 70, True), (c, 50, True), (e, 20, True)]
    sched.prompt_tokens_cap = None  # the whole budget again
    d = seq(150, 3000)
    sched.add(d)
    assert step(sched) == [(a, 1, True), (b, 1, True), (c, 1, True), (e, 1, True),
                           (d, 150, True)]
