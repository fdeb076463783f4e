"""When the server hands streamed tokens over (engine/entrypoints/openai/stream_pacer.py): the
rule on fake timings, and `--stream-interval`'s values."""
from __future__ import annotations

import pytest

from engine.entrypoints.openai.stream_pacer import (
    BUDGET,
    MAX_STEPS,
    MAX_WAIT,
    StreamPacer,
    parse_interval,
)


def steps_until_due(pacer: StreamPacer, step_s: float, limit: int = 50) -> int:
    for n in range(1, limit + 1):
        pacer.stepped(step_s)
        if pacer.due(urgent=False):
            return n
    raise AssertionError("never due")


def test_every_step_with_interval_1_and_every_n_with_n():
    assert [steps_until_due(StreamPacer(1), 0.01) for _ in range(3)] == [1, 1, 1]
    p = StreamPacer(3)
    assert steps_until_due(p, 0.01) == 3
    p.handed_over(0.5)  # however slow the hand-off, N is N
    assert steps_until_due(p, 0.01) == 3


def test_first_tokens_and_ends_are_never_held_back():
    for p in (StreamPacer(4), StreamPacer(None)):
        p.handed_over(1.0)  # an expensive hand-off: auto would wait
        p.stepped(0.001)
        assert not p.due(urgent=False) and p.due(urgent=True)


def test_auto_keeps_the_hand_off_within_its_budget_of_engine_time():
    p = StreamPacer(None)
    assert steps_until_due(p, 0.01) == 1  # nothing measured yet
    p.handed_over(0.0001)  # cheap (one stream): every step
    assert steps_until_due(p, 0.01) == 1
    p = StreamPacer(None)
    p.handed_over(0.0006)  # 6% of a 10 ms step: every second step is 3%
    assert 0.0006 <= BUDGET * 0.02
    assert steps_until_due(p, 0.01) == 2
    p.handed_over(0.0006)
    assert steps_until_due(p, 0.01) == 2


def test_auto_waits_at_most_max_steps_and_max_wait():
    p = StreamPacer(None)
    p.handed_over(1.0)  # a budget no step count meets
    assert steps_until_due(p, 0.001) == MAX_STEPS
    p.handed_over(1.0)
    step = MAX_WAIT / 1.5  # the wait bound comes first: 2 steps pass it
    assert steps_until_due(p, step) == 2


def test_the_measured_cost_follows_the_hand_offs():
    p = StreamPacer(None)
    p.handed_over(0.004)  # a burst of new requests parsed in one round
    assert steps_until_due(p, 0.01) == MAX_STEPS
    for _ in range(8):  # then cheap rounds: back to every step
        p.handed_over(0.0001)
    assert steps_until_due(p, 0.01) == 1


@pytest.mark.parametrize("text,want", [("auto", None), ("1", 1), ("4", 4)])
def test_interval_values(text, want):
    assert parse_interval(text) == want


@pytest.mark.parametrize("text", ["0", "-2", "two", "", "1.5"])
def test_bad_interval_values_name_the_valid_ones(text):
    with pytest.raises(ValueError, match=r"--stream-interval must be 'auto' or a positive"):
        parse_interval(text)
