"""Prefix caching and chunked prefill, offline on the issue's model (random
8-layer 512-hidden Llama), baselines measured in the same run:

- prefix: a request whose first 1500 tokens another request computed before,
  against the same request cold (ratio; target <= 0.3x, issue #30);
- chunked: the longest gap between two tokens of a running stream while a
  3000-token prompt is prefilled, chunked prefill on against off (ratio;
  target <= 0.25x of the prefill's time).

`--check` exits non-zero on a missed target. Timings are wall clock: on a
shared machine, expect noise."""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))  # benchmarks/bisect.py would shadow bisect
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.common import Targets, add_check_argument  # noqa: E402
from benchmarks.models import make_model  # noqa: E402
from engine.entrypoints.llm import LLM  # noqa: E402
from engine.core.messages import EngineCoreRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

ONE = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)


def words(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


def llm(model: Path, **kw) -> LLM:
    return LLM(model=model, dtype="float32", bind_threads=False, max_model_len=4096,
               num_kv_blocks=128, **kw)


def timed(engine: LLM, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    engine.generate([prompt], ONE)
    return time.perf_counter() - t0


def prefix(model: Path) -> float:
    engine = llm(model)
    shared = words(1500, 1)
    timed(engine, words(200, 9))  # warm
    cold = timed(engine, shared + words(20, 2))
    warm = timed(engine, shared + words(20, 3))
    print(f"prefix: cold {cold:.3f} s, sharing 1500 tokens {warm:.3f} s: {warm / cold:.2f}x")
    return warm / cold


def longest_gap(model: Path, chunked: bool, budget: int | None) -> tuple[float, float]:
    """(longest gap between two tokens of a running stream while a 3000-token
    prompt is prefilled, the time that prompt took to its first token)."""
    engine = llm(model, enable_chunked_prefill=chunked, enable_prefix_caching=False,
                 max_num_batched_tokens=budget if chunked else None)
    core = engine.core
    core.add_request(EngineCoreRequest("warm", words(64, 5), ONE))
    while core.has_unfinished():
        core.step()
    core.add_request(EngineCoreRequest("stream", words(16, 6), SamplingParams(
        temperature=0, max_tokens=10_000, ignore_eos=True)))
    core.step()
    core.add_request(EngineCoreRequest("long", words(3000, 7), ONE))
    last, gap, t0 = time.perf_counter(), 0.0, time.perf_counter()
    prefill = None
    got_stream = False
    while prefill is None or not got_stream:  # to the stream's first token after the prompt's
        got = {o.request_id: o for o in core.step().outputs}
        now = time.perf_counter()
        got_stream = "stream" in got
        if got_stream:
            gap, last = max(gap, now - last), now
        if prefill is None and "long" in got and got["long"].finish_reason is not None:
            prefill = now - t0
    core.abort_requests(["stream"])
    budget = core.scheduler.max_num_batched_tokens
    print(f"chunked prefill {f'on (budget {budget})' if chunked else 'off'}: 3000-token prompt {prefill:.2f} s, "
          f"longest gap of a running stream {gap:.3f} s")
    return gap, prefill


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_check_argument(p)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the chunked run's budget (default: the engine's)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "small", "small", max_pos=4096)
        ratio = prefix(model)
        on, _ = longest_gap(model, True, args.max_num_batched_tokens)
        off, prefill = longest_gap(model, False, None)
    print(f"longest stream gap: chunked {on:.3f} s vs whole {off:.3f} s: {on / off:.2f}x; "
          f"{on / prefill:.2f}x of the unchunked prefill")
    targets = Targets()
    targets.record("prefix hit vs cold (1500 shared tokens)", ratio, 0.3, higher_is_better=False)
    targets.record("stream gap, chunked, vs the unchunked prefill", on / prefill, 0.25,
                   higher_is_better=False)
    return targets.finish(args.check, record_as="scheduler" if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
