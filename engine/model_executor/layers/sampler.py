"""One token per sequence from the batch's logits, in upstream vLLM V1's order:
logit_bias and min_tokens, then the repetition / frequency / presence
penalties, then greedy, or temperature, min_p, top-k, top-p and a draw from
the request's own generator. Logprobs are those of the raw logits (upstream's
default logprobs mode), recorded on the sequence.

The processing steps are batched tensor ops and run only when some request
of the batch asks for them: a batch of plain requests pays one argmax and
the per-row draw it always paid; a grammar bitmask (structured outputs) masks
the rows of constrained requests first."""
from __future__ import annotations

import logging

import torch

from engine import ops
from engine.sampling_params import SamplingParams

logger = logging.getLogger("engine")


def sample(logits: torch.Tensor, seqs: list, eos_token_ids=(),
           grammar_bitmask: tuple[torch.Tensor, list[int]] | None = None) -> list[int]:
    """seqs: the batch's Sequences (token_ids, num_prompt_tokens, params,
    generator(device), logprobs); grammar_bitmask (structured outputs): a row
    of packed bits per sequence, and the rows to apply it to (no token may be
    drawn from a zero bit); the logits are masked in place."""
    params: list[SamplingParams] = [s.params for s in seqs]
    if grammar_bitmask is None and all(p.greedy and not p.needs_processing and
                                       p.logprobs is None for p in params):
        return ops.argmax_rows(logits)  # in place, whatever the model's dtype: exact
    logits = logits.float()
    if grammar_bitmask is not None:  # first, as upstream: logprobs see the mask too
        logits = apply_grammar_bitmask(logits, *grammar_bitmask)
    raw = logits
    if any(p.needs_processing for p in params):
        logits = process_logits(logits, seqs, eos_token_ids)
    # one call for the whole batch: each row's first index of its maximum
    greedy = ops.argmax_rows(logits)
    out = []
    for row, s, p, best in zip(logits, seqs, params, greedy):
        if p.greedy:
            out.append(best)
            continue
        out.append(_draw(row, p, s.generator(logits.device), best))
    if any(p.logprobs is not None for p in params):
        record_logprobs(raw, seqs, out)
    return out


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor,
                          rows: list[int] | None = None) -> torch.Tensor:
    """Tokens whose bit is 0 get -inf in the given rows (all: None), in place
    (bit j of int32 word w is token 32w + j); columns past the bitmask's
    vocabulary (padding) too. On the CPU, xgrammar's kernel: the bits unpacked
    with torch took 3x as long over a 128k vocabulary."""
    vocab = logits.shape[-1]
    rows = list(range(len(logits))) if rows is None else rows
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        import xgrammar as xgr

        xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows, backend="cpu")
        if bitmask.shape[-1] * 32 < vocab:
            logits[rows, bitmask.shape[-1] * 32:] = float("-inf")
        return logits
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    words = bitmask[rows].to(logits.device)
    allowed = ((words.unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :vocab]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]))
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits


def _draw(row: torch.Tensor, p: SamplingParams, g: torch.Generator | None, best: int) -> int:
    probs = probabilities(row, p)
    try:
        return int(torch.multinomial(probs, 1, generator=g))
    except RuntimeError:  # nan/inf logits (a model fault): the request goes on, greedily
        logger.warning("non-finite probabilities while sampling; took the argmax instead")
        return best


def probabilities(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a (non-greedy) request samples from: the row's
    softmax after temperature, min_p, top-k and top-p."""
    row = row / p.temperature
    if p.min_p > 0:
        probs = torch.softmax(row, -1)
        row = row.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    if 0 < p.top_k < row.numel():
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, idx = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, -1)
        # drop tokens once the ones before them already reach top_p
        drop = probs.cumsum(-1) - probs >= p.top_p
        row = row.scatter(0, idx[drop], float("-inf"))
    return torch.softmax(row, -1)


def process_logits(logits: torch.Tensor, seqs: list, eos_token_ids=()) -> torch.Tensor:
    """logit_bias, min_tokens and the three penalties, for the whole batch at once."""
    logits = logits.clone()
    params = [s.params for s in seqs]
    vocab = logits.shape[-1]
    rows, cols, vals = [], [], []
    for i, p in enumerate(params):
        for t, b in (p.logit_bias or {}).items():
            rows.append(i)
            cols.append(t)
            vals.append(float(b))
    if rows:
        logits.index_put_((torch.tensor(rows), torch.tensor(cols)),
                          torch.tensor(vals, dtype=logits.dtype), accumulate=True)
    rows, cols = [], []
    for i, (s, p) in enumerate(zip(seqs, params)):
        if s.num_output_tokens < p.min_tokens:  # no end before min_tokens
            stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
            rows += [i] * len(stops)
            cols += stops
    if rows:
        logits[torch.tensor(rows), torch.tensor(cols)] = float("-inf")
    if any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0
           for p in params):
        logits = apply_penalties(logits, seqs, vocab)
    if any(p.allowed_token_ids or p.bad_words_token_ids for p in params):
        apply_allowed_and_bad_words(logits, seqs)
    return logits


def apply_allowed_and_bad_words(logits: torch.Tensor, seqs: list) -> None:
    """As upstream's: a row with allowed_token_ids samples among them only;
    a bad word's last token is banned where the output ends with the tokens
    before it (a one-token word: always)."""
    for i, s in enumerate(seqs):
        p = s.params
        if p.allowed_token_ids:
            keep = logits[i, p.allowed_token_ids].clone()
            logits[i] = float("-inf")
            logits[i, p.allowed_token_ids] = keep
        output = s.token_ids[s.num_prompt_tokens:]
        for word in p.bad_words_token_ids or ():
            prefix = word[:-1]
            if not prefix or (len(output) >= len(prefix) and output[-len(prefix):] == prefix):
                logits[i, word[-1]] = float("-inf")


def _counts(id_lists: list[list[int]], vocab: int) -> torch.Tensor:
    """[batch, vocab] occurrence counts of each row's ids (padding counts in a
    spare column that is cut off)."""
    width = max((len(x) for x in id_lists), default=0)
    ids = torch.full((len(id_lists), max(width, 1)), vocab, dtype=torch.int64)
    for i, x in enumerate(id_lists):
        if x:
            ids[i, :len(x)] = torch.tensor(x, dtype=torch.int64)
    counts = torch.zeros(len(id_lists), vocab + 1)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=counts.dtype))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, seqs: list, vocab: int) -> torch.Tensor:
    """As upstream's apply_penalties: repetition over prompt and output tokens
    (positive logits divided, others multiplied), frequency and presence over
    the output tokens."""
    params = [s.params for s in seqs]
    out_counts = _counts([s.token_ids[s.num_prompt_tokens:] for s in seqs], vocab)
    out_mask = out_counts > 0
    rep = torch.tensor([p.repetition_penalty for p in params]).unsqueeze(1)
    if bool((rep != 1.0).any()):
        seen = _counts([s.token_ids[:s.num_prompt_tokens] for s in seqs], vocab) > 0
        seen |= out_mask
        factor = torch.where(seen, rep, torch.ones_like(rep))
        logits = torch.where(logits > 0, logits / factor, logits * factor)
    freq = torch.tensor([p.frequency_penalty for p in params]).unsqueeze(1)
    pres = torch.tensor([p.presence_penalty for p in params]).unsqueeze(1)
    return logits - freq * out_counts - pres * out_mask.to(logits.dtype)


def record_logprobs(raw: torch.Tensor, seqs: list, tokens: list[int]) -> None:
    """Append (sampled token's logprob, [(id, logprob) of the top k]) to each
    asking sequence's logprobs."""
    rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    lp = torch.log_softmax(raw[rows], dim=-1)
    k = max(seqs[i].params.logprobs for i in rows)
    chosen = lp.gather(1, torch.tensor([[tokens[i]] for i in rows])).squeeze(1).tolist()
    top_v, top_i = (lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long()))
    top_vals, top_ids = top_v.tolist(), top_i.tolist()
    for j, i in enumerate(rows):
        n = seqs[i].params.logprobs
        seqs[i].logprobs.append((chosen[j], list(zip(top_ids[j][:n], top_vals[j][:n]))))
