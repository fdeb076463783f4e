"""Decode steps replayed from captured graphs (engine/worker/cpu_graph.py), as
upstream replays CUDA graphs: one graph per batch size up to MAX_CAPTURE_SIZE,
captured at the first decode step of that size, over input tensors of its own
that each later step's inputs are copied into. The same kernels on the same
inputs: the logits are the eager step's, bit for bit.

The runner runs eagerly what a graph cannot hold: prefill, LoRA, pipeline or
tensor parallelism, --enforce-eager, and a model whose decode step reads a
value back into Python (a sliding window's lengths): that size is refused
once, with a log line, and stays eager."""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from engine.forward_context import ForwardContext, set_context
from engine.worker.cpu_graph import CapturedStep, capture

logger = logging.getLogger("engine")

#: The largest batch a decode graph is captured for: the per-step Python a graph
#: saves is a few milliseconds, which larger batches spread over more tokens,
#: while each size's graph keeps its activations.
MAX_CAPTURE_SIZE = 16


class DecodeGraphs:
    def __init__(self, model: Callable[..., torch.Tensor], max_blocks: int):
        self.model, self.max_blocks = model, max_blocks
        n = MAX_CAPTURE_SIZE
        self.ids = torch.zeros(n, dtype=torch.int64)
        self.positions = torch.zeros(n, dtype=torch.int64)
        self.slots = torch.full((n,), -1, dtype=torch.int64)
        self.last = torch.arange(n, dtype=torch.int64)
        self.seq_lens = torch.ones(n, dtype=torch.int32)
        self.tables = torch.zeros(n, max_blocks, dtype=torch.int32)
        self.graphs: dict[int, CapturedStep] = {}
        self.refused: dict[int, str] = {}

    def run(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor | None:
        """The step's logits from this size's graph (captured now if it has none);
        None where the step runs eagerly instead."""
        n = ids.shape[0]
        if n > MAX_CAPTURE_SIZE or n in self.refused or tables.shape[1] > self.max_blocks:
            return None
        self.ids[:n].copy_(ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(slots)
        self.seq_lens[:n].copy_(seq_lens)
        self.tables[:n, :tables.shape[1]].copy_(tables)
        graph = self.graphs.get(n)
        if graph is not None:
            return graph.replay()
        logits, graph_or_why = capture(lambda: self._forward(n))
        if isinstance(graph_or_why, str):
            self.refused[n] = graph_or_why
            logger.info("decode steps of %d sequences run eagerly: %s", n, graph_or_why)
        else:
            self.graphs[n] = graph_or_why
            logger.debug("decode graph of %d sequences: %d ops in C++, %d in Python", n,
                         graph_or_why.native_calls, graph_or_why.python_calls)
        return logits

    def _forward(self, n: int) -> torch.Tensor:
        set_context(ForwardContext(False, self.slots[:n], block_tables=self.tables[:n],
                                   seq_lens=self.seq_lens[:n]))
        try:
            return self.model(self.ids[:n], self.positions[:n], self.last[:n])
        finally:
            set_context(None)
