"""When the server's engine loop hands its streams' tokens over to their
readers, which write them to the sockets.

The loop steps the engine and serves HTTP in one thread, so every hand-off is
time the engine does not step: measured on 2 cores, 0.5-0.7 ms for one stream
and about 1.9 ms for 16 (a loop round, then per stream a JSON event, an h11
chunk and a loopback write), 10-15% of the small benchmark model's 5 and
11 ms steps. Upstream pays the same per event and offers `--stream-interval N`
(tokens per event, default 1); its API server, a process of its own, also
merges the outputs of a reader that fell behind. Here:

- `--stream-interval N`: every N steps;
- `auto` (the server's default): every step while a hand-off costs at most
  BUDGET of the engine time since the last one, else after enough steps that
  it does (at most MAX_STEPS steps and MAX_WAIT seconds of engine time);

and either way at once when a request got its first token or finished, so
time to first token and the end of a request never wait. Merged tokens reach
the client as one event with their text joined."""
from __future__ import annotations

BUDGET = 0.03  # hand-off time per second of engine time, in "auto"
MAX_STEPS = 4
MAX_WAIT = 0.1  # seconds of engine time: bounds how long /health and new requests wait


def parse_interval(text: str) -> int | None:
    """`--stream-interval`'s value: a positive step count, or None for auto."""
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--stream-interval must be 'auto' or a positive number of steps, "
                         f"got {text!r}")
    return n


class StreamPacer:
    def __init__(self, interval: int | None = 1):
        self.interval = interval  # None: auto
        self.handoff = 0.0  # seconds one hand-off takes (a moving average)
        self.steps = 0      # since the last hand-off
        self.engine = 0.0   # seconds of engine steps since the last hand-off

    def stepped(self, seconds: float) -> None:
        self.steps += 1
        self.engine += seconds

    def due(self, urgent: bool) -> bool:
        """Hand over now? urgent: a request got its first token or finished."""
        if urgent or self.interval == 1:
            return True
        if self.interval is not None:
            return self.steps >= self.interval
        return (self.steps >= MAX_STEPS or self.engine >= MAX_WAIT
                or self.handoff <= BUDGET * self.engine)

    def handed_over(self, seconds: float) -> None:
        self.handoff = 0.5 * (self.handoff + seconds) if self.handoff else seconds
        self.steps = 0
        self.engine = 0.0
