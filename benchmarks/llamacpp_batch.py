"""llama.cpp's best at N concurrent requests, as its server runs N parallel
slots: one context holding N sequences, every step one llama_decode of a batch
with one token per running sequence (prompts prefilled together first),
greedy picks from each sequence's logits. llama-cpp-python's low-level API."""
from __future__ import annotations

import ctypes

import numpy as np


class BatchedLlamaCpp:
    def __init__(self, model_path: str, n_seq: int, n_ctx_per_seq: int, threads: int):
        import llama_cpp as lc

        self.lc, self.n_seq = lc, n_seq
        # its loader logs every tensor at start: silence, as Llama(verbose=False) does
        self._quiet = lc.llama_log_callback(lambda level, text, data: None)
        lc.llama_log_set(self._quiet, ctypes.c_void_p())
        from llamacpp_compat import model_params  # tests/: the AMX crash avoided

        mp = model_params(lc)
        self.model = lc.llama_model_load_from_file(model_path.encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max = n_seq * n_ctx_per_seq, n_seq
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.kv_unified = True  # slots share one cache, as llama-server's default
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch = lc.llama_batch_init(512, 0, n_seq)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> list[int]:
        """items: (token, pos, seq, wants_logits), at most 512; the greedy pick of
        each item that wants logits, in order."""
        lc, b = self.lc, self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, out) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0], b.logits[i] = seq, out
        if lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        picks = []
        for i, (_, _, _, out) in enumerate(items):
            if out:
                ptr = lc.llama_get_logits_ith(self.ctx, i)
                row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                            shape=(self.n_vocab,))
                picks.append(int(row.argmax()))
        return picks

    def generate(self, prompts: list[list[int]], new: int) -> list[list[int]]:
        lc = self.lc
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        items = [(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts)
                 for pos, t in enumerate(p)]
        picks: list[int] = []
        for at in range(0, len(items), 512):  # whole prompts together, 512 a call
            picks += self._decode(items[at:at + 512])
        out = [[t] for t in picks]
        for step in range(1, new):
            picks = self._decode([(o[-1], len(p) + step - 1, s, True)
                                  for s, (p, o) in enumerate(zip(prompts, out))])
            for o, t in zip(out, picks):
                o.append(t)
        return out

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)
