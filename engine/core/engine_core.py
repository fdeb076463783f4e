"""The engine core: the request lifecycle over a scheduler, a KV cache and an
executor, advanced one step at a time. Requests may be added or aborted between
any two steps: a new one joins the running batch at the next step, a finished
one leaves, an aborted one gives its KV blocks back at once. The offline `LLM`
drives it in a loop; the server's `AsyncLLM` steps it inside the event loop
that serves the requests."""
from __future__ import annotations

import os

from engine.core.detokenizer import output_text
from engine.core.kv_cache_manager import BlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence
from engine.core.stop_checker import check_stop
from engine.engine_args import EngineConfig, create_engine_config
from engine.executor.select import make_executor
from engine.sampling_params import SamplingParams


class EngineCore:
    """`EngineCore(model, dtype, **engine_args)`: the arguments of
    engine.engine_args.create_engine_config."""

    def __init__(self, model: str | os.PathLike, dtype: str = "auto", **engine_args):
        self.engine_config: EngineConfig = create_engine_config(model, dtype, **engine_args)
        c = self.engine_config
        self.path, self.config, self.dtype = c.path, c.model, c.dtype
        self.max_model_len = c.max_model_len
        self.tokenizer = _tokenizer(c.path)
        self.blocks = BlockManager(c.num_blocks, c.block_size, c.enable_prefix_caching)
        self.executor = make_executor(c, self.blocks)
        self.scheduler = Scheduler(self.blocks, c.max_num_seqs, c.max_num_batched_tokens,
                                   c.enable_chunked_prefill)
        self.requests: dict[str, Sequence] = {}
        self.last_scheduled: list[Sequence] = []

    # ---- requests ------------------------------------------------------------

    def make_sequence(self, request_id: str, prompt, params: SamplingParams,
                      index: int = 0) -> Sequence:
        """A checked, not yet scheduled request: a prompt string (tokenized with
        the model's special tokens) or a list of token ids."""
        if isinstance(prompt, str):
            ids, text = self.tokenizer.encode(prompt).ids, prompt
        else:
            ids, text = list(prompt), None
            vocab = self.config.vocab_size
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt {index}: token ids must be integers in [0, {vocab})")
        if not ids:
            raise ValueError(f"prompt {index} is empty")
        params.check_vocab(self.config.vocab_size)
        if len(ids) + 1 > self.max_model_len:
            raise ValueError(f"prompt {index} has {len(ids)} tokens; the model's context is "
                             f"{self.max_model_len}")
        return Sequence(ids, params, text, index, request_id)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"request id {seq.request_id!r} is already running")
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request, waiting or running; its KV blocks are free on return."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.abort(seq)
        return True

    def check_health(self) -> None:
        """Raises when the executor lost a part (a tensor-parallel rank)."""
        self.executor.check_health()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[Sequence]:
        """Run one batch; returns the sequences that got a token (the newest is
        token_ids[-1]; a partial prefill chunk gets none); finished ones have
        finish_reason set and are gone."""
        seqs, is_prefill = self.scheduler.schedule()
        self.last_scheduled = seqs  # a step that raises fails these requests (AsyncLLM)
        if not seqs:
            raise RuntimeError("no sequence could be scheduled: the KV cache is too small")
        sampled = [s for s in seqs if s.samples]
        try:
            tokens = self.executor.execute_model(seqs, is_prefill)
        finally:
            self.scheduler.copies_done()
        for seq in seqs:
            seq.num_computed_tokens += seq.num_scheduled_tokens
            self.blocks.cache_full_blocks(seq)
        for seq, token in zip(sampled, tokens):
            seq.token_ids.append(token)
            reason = check_stop(seq, token, self.config.eos_token_ids, self.max_model_len,
                                self.tokenizer)
            if reason:
                self.scheduler.finish(seq, reason)
                self.requests.pop(seq.request_id, None)
        return sampled

    def output_text(self, seq: Sequence) -> str:
        """The output's text, joined to the prompt as transformers decodes it;
        cut at the stop string when one matched."""
        if isinstance(seq.stop_string, str):
            return seq.text
        return output_text(self.tokenizer, seq.token_ids[:seq.num_prompt_tokens],
                           seq.output_token_ids)


def _tokenizer(path):
    from tokenizers import Tokenizer

    file = path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{path} has no tokenizer.json")
    return Tokenizer.from_file(str(file))
