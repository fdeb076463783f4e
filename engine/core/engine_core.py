"""The engine core: the request lifecycle over a scheduler, a KV cache and an
executor, advanced one step at a time, in token ids only (the front ends
tokenize and detokenize). Requests may be added or aborted between any two
steps: a new one joins the running batch at the next step, a finished one
leaves, an aborted one gives its KV blocks back at once. The offline `LLM`
drives it in a loop; `engine serve` runs it in a process of its own
(engine/core/engine_core_proc.py), as upstream V1."""
from __future__ import annotations

import os
import time

import torch

from engine.core.kv_cache_manager import BlockManager
from engine.core.messages import EngineCoreOutputs, EngineCoreRequest, SchedulerStats
from engine.core.pooling_scheduler import PoolingScheduler
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import Sequence
from engine.distributed.parallel_state import RankDiedError
from engine.engine_args import EngineConfig, create_engine_config
from engine.executor.select import make_executor
from engine.pooling_params import NO_SAMPLING
from engine.spec_decode.draft_model_proposer import DraftModelProposer
from engine.spec_decode.metrics import SpecDecodingStats
from engine.spec_decode.ngram_proposer import NgramProposer
from engine.structured_output import StructuredOutputManager, StructuredOutputsConfig

COMPILE_POLL_S = 0.002  # a core with only compiling requests checks them this often


class EngineCore:
    """`EngineCore(model, dtype, **engine_args)`: the arguments of
    engine.engine_args.create_engine_config."""

    def __init__(self, model: str | os.PathLike, dtype: str = "auto", **engine_args):
        self.engine_config: EngineConfig = create_engine_config(model, dtype, **engine_args)
        c = self.engine_config
        self.path, self.config, self.dtype = c.path, c.model, c.dtype
        self.max_model_len = c.max_model_len
        self.scheduler: Scheduler
        if c.pooler is not None:  # no KV cache: engine/core/pooling_scheduler.py
            self.scheduler = PoolingScheduler(c.max_num_seqs, c.max_num_batched_tokens,
                                              c.block_size)
            self.blocks = self.scheduler.blocks
        else:
            self.blocks = BlockManager(c.num_blocks, c.block_size, c.enable_prefix_caching)
            self.scheduler = Scheduler(self.blocks, c.max_num_seqs, c.max_num_batched_tokens,
                                       c.enable_chunked_prefill, tuple(c.model.eos_token_ids),
                                       c.max_model_len)
        self.executor = make_executor(c, self.blocks)
        spec = c.speculative_config
        self.drafter: NgramProposer | DraftModelProposer | None = None
        if spec is not None and spec.model is not None:
            self.drafter = DraftModelProposer(spec, c, EngineCore)
        elif spec is not None:
            self.drafter = NgramProposer(spec, c.max_model_len)
        if spec:
            self.scheduler.spec_stats = SpecDecodingStats.for_tokens(spec.num_speculative_tokens)
        self.structured_output = StructuredOutputManager(
            c.tokenizer_path, c.model.vocab_size, list(c.model.eos_token_ids),
            StructuredOutputsConfig.parse(c.structured_outputs_config))
        self.scheduler.structured_output = self.structured_output
        if c.lora_config is not None:  # a step mixes at most max_loras adapters
            self.scheduler.max_loras = c.lora_config.max_loras
        self.compiling: list[Sequence] = []  # their grammar compiles; scheduled once it has
        if c.seed is not None:  # unseeded requests draw from the global generator
            torch.manual_seed(c.seed)
        self.requests: dict[str, Sequence] = {}
        self.last_scheduled: list[str] = []  # request ids of the step under way
        self.last_output: SchedulerOutput | None = None

    # ---- requests ------------------------------------------------------------

    def add_request(self, req: EngineCoreRequest) -> None:
        """ValueError for a request the front end should have refused (the
        core checks again: a bad id must never reach a kernel)."""
        if req.request_id in self.requests:
            raise ValueError(f"request id {req.request_id!r} is already running")
        ids, vocab = req.prompt_token_ids, self.config.vocab_size
        pooling = self.engine_config.pooler is not None
        if (req.pooling_params is not None) != pooling or (req.sampling_params is None) != pooling:
            raise ValueError(f"request {req.request_id}: this engine "
                             f"{'pools' if pooling else 'generates'}; the request asks otherwise")
        room = 0 if pooling else 1  # a generated token's place
        if not ids or len(ids) + room > self.max_model_len:
            raise ValueError(f"request {req.request_id}: {len(ids)} prompt tokens; the "
                             f"context is {self.max_model_len}")
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"request {req.request_id}: token ids must be in [0, {vocab})")
        types = req.token_type_ids
        if types is not None and (len(types) != len(ids) or min(types) < 0
                                  or max(types) >= self.config.hf.get("type_vocab_size", 2)):
            raise ValueError(f"request {req.request_id}: token_type_ids must be one per token, "
                             "each a type the model has")
        seq = Sequence(ids, req.sampling_params or NO_SAMPLING, req.request_id, req.client_index)
        if req.lora_request is not None and self.engine_config.lora_config is None:
            raise ValueError(f"request {req.request_id}: LoRA adapter "
                             f"{req.lora_request.lora_name!r} asked; start the engine with "
                             "--enable-lora")
        seq.pooling_params, seq.token_type_ids = req.pooling_params, types
        seq.lora_request = req.lora_request
        self.requests[seq.request_id] = seq
        if req.sampling_params is not None and req.sampling_params.structured_outputs is not None:
            self.structured_output.grammar_init(seq)
            self.compiling.append(seq)
        else:
            self.scheduler.add(seq)

    def abort_requests(self, request_ids) -> None:
        """Drop requests, waiting or running; their KV blocks are free on return."""
        for request_id in request_ids:
            seq = self.requests.pop(request_id, None)
            if seq is not None and seq in self.compiling:
                self.compiling.remove(seq)
            elif seq is not None:
                self.scheduler.abort(seq)

    def check_health(self) -> None:
        """Raises when the executor lost a part (a tensor-parallel rank)."""
        self.executor.check_health()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or bool(self.compiling)

    def _admit_compiled(self) -> tuple[list[str], str | None]:
        """Schedule the requests whose grammar is ready; (those whose grammar
        failed, and the first one's error line): they end here."""
        failed: list[str] = []
        failure = None
        for seq in list(self.compiling):
            ready = self.structured_output.ready(seq)
            if ready is False:
                continue
            self.compiling.remove(seq)
            if ready is True:
                self.scheduler.add(seq)
            elif failure is None or ready == failure:  # one line per step: others wait
                failure = ready
                failed.append(seq.request_id)
                self.requests.pop(seq.request_id, None)
            else:
                self.compiling.insert(0, seq)
        return failed, failure

    def step(self) -> EngineCoreOutputs:
        """Run one batch: each request that got a token has an output (a
        partial prefill chunk gets none), the last one with finish_reason.
        A batch that raises is run again a request at a time: those that
        raise again fail (failed_request_ids), the others go on. A step whose
        every request fails raises, leaving last_scheduled naming them."""
        failed, failure = self._admit_compiled()
        if failed or not self.scheduler.has_work():
            # grammars that failed are told now (a step that raised would lose them);
            # with only grammars compiling there is nothing to run yet
            self.last_output, self.last_scheduled = None, []
            if not failed:
                time.sleep(COMPILE_POLL_S)
            return EngineCoreOutputs([], self.make_stats(), time.monotonic(),
                                     failed_request_ids=failed, failure=failure)
        if self.drafter is not None:  # a constrained request decodes undrafted
            self.drafter.propose_for([s for s in self.scheduler.running if s.grammar is None])
        out = self.scheduler.schedule()
        self.last_output = out
        self.last_scheduled = [s.request_id for s in out.scheduled]
        if not out.scheduled:
            raise RuntimeError("no sequence could be scheduled: the KV cache is too small")
        grammar = self._grammar([s for s in out.sampled if not s.spec_token_ids])
        started = time.monotonic()
        step_tokens = sum(s.num_scheduled_tokens for s in out.scheduled)
        for s in out.scheduled:
            if s.first_scheduled is None:
                s.first_scheduled = started
        try:
            tokens = self.executor.execute_model(out.scheduled, out.is_prefill, **grammar)
        except Exception as exc:
            if len(out.scheduled) == 1 or isinstance(exc, RankDiedError):
                raise
            out, tokens, failed, failure = self._one_at_a_time(out, exc)
        finally:
            self.scheduler.copies_done()
        outputs = self.scheduler.update_from_output(out, tokens)
        for o in outputs:
            seq = self.requests.get(o.request_id)
            if seq is not None and not seq.scheduled_sent:
                o.scheduled_time, seq.scheduled_sent = seq.first_scheduled or started, True
            if o.finish_reason is not None:
                self.requests.pop(o.request_id, None)
                o.num_preemptions = seq.num_preemptions if seq is not None else 0
        stats = self.make_stats()
        stats.num_scheduled_tokens = step_tokens
        return EngineCoreOutputs(outputs, stats, time.monotonic(),
                                 failed_request_ids=failed, failure=failure)

    def _grammar(self, sampled: list[Sequence]) -> dict:
        """execute_model's bitmask argument: only for a batch with a grammar."""
        bitmask = self.structured_output.grammar_bitmask(sampled)
        return {} if bitmask is None else {"bitmask": bitmask}

    def _one_at_a_time(self, out: SchedulerOutput, exc: Exception):
        """(the step's output without the requests that raise alone, their
        tokens, those requests' ids, the first one's error line)."""
        tokens: dict[str, list[int]] = {}
        bad: list[tuple[Sequence, Exception]] = []
        for seq in out.scheduled:
            try:
                tokens[seq.request_id] = self.executor.execute_model(
                    [seq], out.is_prefill, **self._grammar([seq] if seq.samples else []))
            except Exception as again:
                if isinstance(again, RankDiedError):
                    raise
                bad.append((seq, again))
        if len(bad) == len(out.scheduled):
            raise exc  # not one request's doing: the step's failure, as before
        for seq, _ in bad:
            self.scheduler.abort(seq)
            self.requests.pop(seq.request_id, None)
        good = [s for s in out.scheduled if s.request_id in tokens]
        sampled = [s for s in out.sampled if s.request_id in tokens]
        first = bad[0][1]
        return (SchedulerOutput(good, out.is_prefill, sampled, out.preempted_req_ids),
                [t for s in sampled for t in tokens[s.request_id]],
                [s.request_id for s, _ in bad],
                f"{type(first).__name__}: {first}".splitlines()[0])

    def make_stats(self) -> SchedulerStats:
        s, b = self.scheduler, self.blocks
        return SchedulerStats(len(s.running), len(s.waiting),
                              (b.num_blocks - b.num_free) / max(b.num_blocks, 1),
                              b.prefix_queries, b.prefix_hits, s.num_preemptions,
                              s.spec_stats)

    def shutdown(self) -> None:
        shutdown = getattr(self.executor, "shutdown", None)
        if shutdown is not None:
            shutdown()

