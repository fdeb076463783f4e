"""Structured outputs in the engine core (upstream V1's StructuredOutputManager):
a request's grammar is compiled in a worker thread while the request waits
(EngineCore holds it out of the scheduler until then, failing it past
VLLM_STRUCTURED_OUTPUTS_TIMEOUT_S); each step, the sampled rows' token
bitmask is filled (in the step, or for a large batch in a thread while the
forward runs), and the sampler applies it to the constrained rows before
sampling; each sampled token then advances the request's matcher. Requests
without a constraint pay nothing: no bitmask is made for a batch with none,
and xgrammar is imported by the first one."""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from engine import envs
from engine.sampling_params import StructuredOutputsParams

__all__ = ["StructuredOutputManager", "StructuredOutputsConfig"]

# Up to this many constrained rows the bitmask is filled in the step itself, as
# upstream's (fill_bitmask_parallel_threshold): 16 rows of a JSON schema take
# 0.05 ms there, and 1.2 ms a step handed to a thread beside the forward (the
# fill holds the GIL the step's Python needs back; 4-layer 256-hidden model).
FILL_IN_STEP_ROWS = 128


class StructuredOutputsConfig:
    """--structured-outputs-config: {"backend": "xgrammar"} (or "auto", upstream's
    default, which is xgrammar here); anything else is refused by name."""

    def __init__(self, backend: str = "auto", disable_any_whitespace: bool = False):
        from engine.structured_output.backend_xgrammar import BACKENDS

        if backend not in ("auto", *BACKENDS):
            raise ValueError(f"--structured-outputs-config: backend {backend!r} is not "
                             f"available; use {', '.join(BACKENDS)} (or auto)")
        self.backend = "xgrammar"
        self.disable_any_whitespace = bool(disable_any_whitespace)

    @classmethod
    def parse(cls, given: str | dict | None) -> StructuredOutputsConfig:
        import json

        if given is None or isinstance(given, dict):
            data = given or {}
        else:
            try:
                data = json.loads(given)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--structured-outputs-config is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("--structured-outputs-config must be a JSON object, e.g. "
                             "'{\"backend\": \"xgrammar\"}'")
        unknown = sorted(set(data) - {"backend", "disable_any_whitespace"})
        if unknown:
            raise ValueError(f"--structured-outputs-config: {', '.join(unknown)} is not "
                             "supported; use backend, disable_any_whitespace")
        return cls(**data)


class _Pending:
    def __init__(self, future: Future, deadline: float):
        self.future, self.deadline = future, deadline


class StructuredOutputManager:
    def __init__(self, tokenizer_dir: Path, vocab_size: int, eos_token_ids: list[int],
                 config: StructuredOutputsConfig | None = None):
        self.tokenizer_dir, self.vocab_size = tokenizer_dir, vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.config = config or StructuredOutputsConfig()
        self._backend = None
        # two compiles at once: one that runs past its time (its thread cannot be
        # stopped) leaves the other to the next requests; the fills have their own
        self._compiles = ThreadPoolExecutor(2, thread_name_prefix="grammar-compile")
        self._fills = ThreadPoolExecutor(1, thread_name_prefix="grammar-bitmask")
        self.timeout_s = envs.structured_outputs_timeout_s()

    def _get_backend(self):
        if self._backend is None:
            from engine.structured_output.backend_xgrammar import XgrammarBackend

            self._backend = XgrammarBackend(self.tokenizer_dir, self.vocab_size,
                                            self.eos_token_ids)
        return self._backend

    # ---- requests --------------------------------------------------------------

    def grammar_init(self, seq) -> None:
        """Start compiling seq's constraint; seq waits for it (ready())."""
        p: StructuredOutputsParams = seq.params.structured_outputs
        if self.config.disable_any_whitespace:
            p.disable_any_whitespace = True

        def compile_():
            backend = self._get_backend()
            matcher = backend.matcher(backend.compile(p))
            # when it ended, not when a step looked: a step can run seconds late
            # (the first decode graph's capture imports torch._dynamo while this
            # thread imports transformers), and the grammar is done by then
            return matcher, time.monotonic()

        seq.grammar_pending = _Pending(self._compiles.submit(compile_),
                                       time.monotonic() + self.timeout_s)
        # a think block the chat template closed at the prompt's end (thinking off)
        tail = seq.token_ids[-2 * len(p.reasoning_end or ()) - 8:]
        seq.reasoning_ended = _reasoning_ended(tail, p.reasoning_end)

    def ready(self, seq) -> bool | str:
        """True once compiled (seq.grammar set), False while compiling, or the
        error line that fails the request."""
        pending: _Pending = seq.grammar_pending
        if not pending.future.done():
            if time.monotonic() < pending.deadline:
                return False
            pending.future.cancel()
            return self._too_slow()
        try:
            grammar, finished = pending.future.result()
        except Exception as exc:  # noqa: BLE001 - the client's schema, one line
            from engine.structured_output.backend_xgrammar import error_line

            return f"structured_outputs: the grammar does not compile: {error_line(exc)}"
        if finished > pending.deadline:  # the same answer however the threads took turns
            return self._too_slow()
        seq.grammar = grammar
        seq.grammar_pending = None
        return True

    def _too_slow(self) -> str:
        return (f"structured_outputs: the grammar took more than {self.timeout_s:g} s to "
                "compile; simplify the schema")

    # ---- steps -----------------------------------------------------------------

    def grammar_bitmask(self, seqs) -> Future | None:
        """A Future of the bitmask of the step's sampled rows and the rows it
        applies to (the sampler's grammar_bitmask); None when no row has a
        constraint."""
        rows = [(i, s.grammar) for i, s in enumerate(seqs)
                if s.grammar is not None and s.reasoning_ended]
        if not rows:
            return None
        backend = self._get_backend()
        if len(rows) > FILL_IN_STEP_ROWS:
            return self._fills.submit(backend.bitmask, len(seqs), rows)
        done: Future = Future()
        done.set_result(backend.bitmask(len(seqs), rows))
        return done

    def accept(self, seq, token: int) -> bool:
        """Advance seq's matcher by its sampled token (after its reasoning);
        False when the grammar is complete or refuses it: the request ends."""
        if not seq.reasoning_ended:
            end = seq.params.structured_outputs.reasoning_end
            seq.reasoning_ended = _reasoning_ended(seq.output_token_ids[-len(end):], end)
            return True
        return seq.grammar.accept_token(token) and not seq.grammar.is_terminated()


def _reasoning_ended(ids: list[int], end: list[int] | None) -> bool:
    """No reasoning to wait for, or its end sequence already among ids."""
    if not end:
        return True
    n = len(end)
    return any(ids[i:i + n] == end for i in range(len(ids) - n + 1))
