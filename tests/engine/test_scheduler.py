"""The scheduler's token budget (chunked prefill, prefix hits, preemption)
and the engine arguments that bound it, on stand-in steps: no model runs."""
from __future__ import annotations

import pytest

from engine.core.kv_cache_manager import BlockManager
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import RequestStatus, Sequence
from engine.engine_args import batch_bounds, prefix_reading
from engine.sampling_params import SamplingParams

BS = 16


def seq(n: int, first: int = 0) -> Sequence:
    # no budget ends these sequences (the scheduler has no eos ids): only the tests do
    return Sequence(list(range(first, first + n)), SamplingParams(max_tokens=10_000))


def run_step(sched: Scheduler) -> tuple[SchedulerOutput, list[tuple[Sequence, int, bool]]]:
    """One step as EngineCore runs it (schedule, then update_from_output), with
    token 1 for every sampling sequence: the SchedulerOutput and, per scheduled
    sequence, (it, its scheduled tokens, whether it sampled)."""
    out = sched.schedule()
    rows = [(s, s.num_scheduled_tokens, s.samples) for s in out.scheduled]
    assert out.sampled == [s for s, _, sampled in rows if sampled]
    assert out.num_scheduled_tokens == {s.request_id: n for s, n, _ in rows}
    outputs = sched.update_from_output(out, [1] * len(out.sampled))
    assert [(o.request_id, o.new_token_ids) for o in outputs] == \
        [(s.request_id, [1]) for s in out.sampled]
    return out, rows


def step(sched: Scheduler) -> list[tuple[Sequence, int, bool]]:
    return run_step(sched)[1]


def test_decodes_go_first_and_chunks_fill_the_budget():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=40,
                      enable_chunked_prefill=True)
    a, b = seq(10), seq(100, 1000)
    sched.add(a)
    assert step(sched) == [(a, 10, True)]
    sched.add(b)
    assert step(sched) == [(a, 1, True), (b, 39, False)]  # b's first chunk: no token
    assert step(sched) == [(a, 1, True), (b, 39, False)]
    assert step(sched) == [(a, 1, True), (b, 22, True)]  # b's last chunk samples
    assert b.num_computed_tokens == 100 and len(b) == 101
    assert step(sched) == [(a, 1, True), (b, 1, True)]


def test_the_budget_holds_with_many_prompts():
    sched = Scheduler(BlockManager(256, BS), max_num_seqs=6, max_num_batched_tokens=50,
                      enable_chunked_prefill=True)
    seqs = [seq(n, 100 * i) for i, n in enumerate((70, 5, 33, 90, 1, 64, 12))]
    for s in seqs:
        sched.add(s)
    for _ in range(30):
        done = step(sched)
        assert sum(n for _, n, _ in done) <= 50
        assert len(sched.running) <= 6
    assert all(s.num_computed_tokens == len(s) - 1 for s in seqs[:6])  # all decoding
    assert seqs[6] in sched.waiting  # max_num_seqs


def test_without_chunked_prefill_prompts_run_whole_and_alone():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=120)
    a, b, c = seq(10), seq(100, 500), seq(30, 900)
    sched.add(a)
    step(sched)
    sched.add(b)
    sched.add(c)
    assert step(sched) == [(b, 100, True)]  # c would pass the budget: it waits
    assert step(sched) == [(c, 30, True)]
    assert step(sched) == [(a, 1, True), (b, 1, True), (c, 1, True)]


def test_a_cached_prefix_is_skipped():
    bm = BlockManager(64, BS, enable_prefix_caching=True)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=True)
    a = seq(50)
    sched.add(a)
    step(sched)
    b = Sequence(list(range(40)) + [7, 7], SamplingParams(max_tokens=10_000))
    sched.add(b)
    assert step(sched) == [(a, 1, True), (b, 42 - 32, True)]  # two blocks of 16 hit
    assert b.block_table[:2] == a.block_table[:2]
    assert (bm.prefix_queries, bm.prefix_hits) == (50 + 42, 32)
    whole = Sequence(list(range(32)), SamplingParams(max_tokens=10_000))
    sched.add(whole)  # all of it cached: the last block is recomputed for its logits
    assert step(sched)[-1] == (whole, 16, True)


def test_preemption_frees_the_newest_and_recomputes_it():
    sched = Scheduler(BlockManager(4, BS), max_num_seqs=8, max_num_batched_tokens=64,
                      enable_chunked_prefill=True)
    a, b = seq(20), seq(20, 100)
    sched.add(a)
    sched.add(b)
    assert step(sched) == [(a, 20, True), (b, 20, True)]  # the four blocks; room for a's next
    for _ in range(12):
        assert step(sched) == [(a, 1, True), (b, 1, True)]
    assert len(a) == len(b) == 33
    # both now need a third block for their 33rd token's K/V: b, the newest, is preempted
    out, rows = run_step(sched)
    assert rows == [(a, 1, True)] and out.preempted_req_ids == [b.request_id]
    assert sched.num_preemptions == 1 and b in sched.waiting and b.block_table == []
    assert b.num_computed_tokens == 0 and b.status == RequestStatus.PREEMPTED
    sched.finish(a, RequestStatus.FINISHED_LENGTH_CAPPED)
    assert a.finish_reason == "length" and a.block_table == [] and a not in sched.running
    out, rows = run_step(sched)
    assert rows == [(b, 33, True)] and out.is_prefill  # recomputed with its sampled tokens
    assert out.preempted_req_ids == [] and b.status == RequestStatus.RUNNING


@pytest.mark.parametrize("chunked", [True, False])
def test_admission_leaves_the_running_their_next_block(chunked):
    """A prompt that would take the block a running sequence needs for its
    next token waits (it would be preempted at the next step); the running
    one is never preempted, and the prompt runs once there is room."""
    sched = Scheduler(BlockManager(4, BS), max_num_seqs=8, max_num_batched_tokens=64,
                      enable_chunked_prefill=chunked)
    a, b = seq(31), seq(32, 100)
    sched.add(a)
    assert step(sched) == [(a, 31, True)]  # alone: it may take what it needs
    sched.add(b)  # two blocks free, but a's 33rd token needs one of them
    for _ in range(5):
        assert step(sched) == [(a, 1, True)]
    assert b in sched.waiting and sched.num_preemptions == 0
    sched.finish(a, RequestStatus.FINISHED_LENGTH_CAPPED)
    assert step(sched) == [(b, 32, True)]


def test_admission_keeps_the_watermark():
    sched = Scheduler(BlockManager(200, BS), max_num_seqs=8, max_num_batched_tokens=4096,
                      enable_chunked_prefill=True)
    assert sched.watermark_blocks == 2
    a, b = seq(10), seq(198 * BS - 10, 1000)  # b would leave 1 block free (a needs none)
    sched.add(a)
    step(sched)
    sched.add(b)
    assert step(sched) == [(a, 1, True)] and b in sched.waiting
    c = seq(197 * BS - 10, 1000)  # leaves 2
    sched.waiting.clear()
    sched.add(c)
    assert [s for s, _, _ in step(sched)] == [a, c]


@pytest.mark.parametrize("case", ["eos", "eos-ignored", "stop-token", "min-tokens",
                                  "max-tokens", "context"])
def test_update_from_output_ends_sequences_as_check_stop_says(case):
    """The core's stop conditions (engine/core/stop_checker.py; stop strings are
    the front end's): the last output says why, the sequence leaves the
    running batch and gives its blocks back."""
    params = {"eos": {}, "eos-ignored": {"ignore_eos": True}, "stop-token": {"stop_token_ids": [7]},
              "min-tokens": {"min_tokens": 3}, "max-tokens": {"max_tokens": 2},
              "context": {}}[case]
    sched = Scheduler(BlockManager(8, BS), max_num_seqs=4, max_num_batched_tokens=64,
                      enable_chunked_prefill=True, eos_token_ids=(2,),
                      max_model_len=13 if case == "context" else 64)
    a = Sequence(list(range(10, 20)), SamplingParams(**{"max_tokens": 50, **params}))
    sched.add(a)
    sampled = {"eos": [5, 2], "eos-ignored": [2, 2, 2, 2], "stop-token": [5, 7],
               "min-tokens": [2, 2, 2, 2], "max-tokens": [5, 6], "context": [5, 6, 8]}[case]
    outputs = []
    for token in sampled:
        if a.status.finished:
            assert not sched.schedule().scheduled  # nothing left to run
            break
        out = sched.schedule()
        assert out.sampled == [a]
        outputs += sched.update_from_output(out, [token])
    want = {"eos": ("stop", None, 2), "eos-ignored": (None, None, 4),
            "stop-token": ("stop", 7, 2), "min-tokens": ("stop", None, 3),
            "max-tokens": ("length", None, 2), "context": ("length", None, 3)}[case]
    reason, stop_reason, n = want
    assert [o.new_token_ids for o in outputs] == [[t] for t in sampled[:n]]
    assert [o.finish_reason for o in outputs] == [None] * (n - 1) + [reason]
    assert outputs[-1].stop_reason == stop_reason == a.stop_reason
    assert a.finish_reason == reason and a.output_token_ids == sampled[:n]
    if reason is None:
        assert a.status == RequestStatus.RUNNING and list(sched.running) == [a]
    else:
        assert a.status.finished and not sched.running and not sched.has_work()
        assert a.block_table == [] and sched.blocks.num_free == sched.blocks.num_blocks


def test_the_budget_bounds():
    assert batch_bounds(4096, 8, 512, chunked_prefill=True) == 512
    assert batch_bounds(4096, 8, None, chunked_prefill=True) == 2048
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        batch_bounds(4096, 8, 512)
    with pytest.raises(ValueError, match="must be >= max_num_seqs"):
        batch_bounds(4096, 256, 128, chunked_prefill=True)


def test_chunked_prefill_and_prefix_caching_default_on(monkeypatch):
    class Model:
        hf = {}

    assert prefix_reading(Model, None, None) == (True, True)
    assert prefix_reading(Model, False, None) == (False, True)
    with pytest.raises(ValueError, match="must be true or false"):
        prefix_reading(Model, "yes", None)
    Model.hf = {"attn_logit_softcapping": 50.0}
    assert prefix_reading(Model, None, None) == (False, False)
    with pytest.raises(ValueError, match="turn enable_prefix_caching off"):
        prefix_reading(Model, None, True)
    Model.hf = {}
    monkeypatch.setenv("VLLM_PREFILL_ATTENTION", "sdpa")
    assert prefix_reading(Model, None, None) == (False, False)


def test_the_flags_are_upstreams():
    import argparse

    from engine.cli import scheduler_args

    p = argparse.ArgumentParser()
    scheduler_args(p)
    assert vars(p.parse_args([])) == {"enable_chunked_prefill": None,
                                      "enable_prefix_caching": None, "enforce_eager": False}
    args = p.parse_args(["--no-enable-chunked-prefill", "--enable-prefix-caching",
                         "--enforce-eager"])
    assert (args.enable_chunked_prefill, args.enable_prefix_caching, args.enforce_eager) == (
        False, True, True)
