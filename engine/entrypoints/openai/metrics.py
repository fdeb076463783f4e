"""The server's Prometheus metrics, named as upstream vLLM names them. With
several API server processes (--api-server-count), each writes its values
to $PROMETHEUS_MULTIPROC_DIR and /metrics sums them (prometheus_client's
multiprocess mode, as upstream's)."""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from engine.spec_decode.metrics import SpecDecodingStats

# seconds; upstream's buckets, trimmed to what a CPU engine sees
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)


class Metrics:
    """Fed by the engine client: the scheduler stats each step's output
    carries (on_stats), each request's outputs (on_output); and by the
    request handlers (on_prompt). One registry per server."""

    def __init__(self, model_name: str, engine_totals: bool = True):
        """engine_totals: count the core's totals (the prefix cache's
        lookups) here; of N API servers, which all hear them, one does."""
        self.engine_totals = engine_totals
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.",
                             labels, registry=r, multiprocess_mode="mostrecent").labels(model_name)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
                             labels, registry=r, multiprocess_mode="mostrecent").labels(model_name)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use "
                              "(1 = all).", labels, registry=r,
                              multiprocess_mode="mostrecent").labels(model_name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", labels,
                                     registry=r).labels(model_name)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in "
                                      "the prefix cache.", labels, registry=r).labels(model_name)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix "
                                   "cache.", labels, registry=r).labels(model_name)
        self._prefix_seen = (0, 0)  # the block manager's totals at the last step
        self._spec: SpecDecodingProm | None = None  # once a step reports speculation
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", labels,
                                         registry=r).labels(model_name)
        self._success = Counter("vllm:request_success", "Requests finished, by reason.",
                                labels + ["finished_reason"], registry=r)
        self.model_name = model_name
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r).labels(model_name)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time between two output "
                              "tokens of a request.", labels, buckets=TPOT_BUCKETS,
                              registry=r).labels(model_name)

    def on_prompt(self, num_tokens: int) -> None:
        self.prompt_tokens.inc(num_tokens)

    def on_stats(self, stats) -> None:
        """A step's SchedulerStats (engine/core/messages.py); prefix totals since start."""
        self.running.set(stats.num_running_reqs)
        self.waiting.set(stats.num_waiting_reqs)
        self.kv_usage.set(stats.kv_cache_usage)
        if not self.engine_totals:
            return
        queries, hits = self._prefix_seen
        self.prefix_queries.inc(max(stats.prefix_cache_queries - queries, 0))
        self.prefix_hits.inc(max(stats.prefix_cache_hits - hits, 0))
        self._prefix_seen = (stats.prefix_cache_queries, stats.prefix_cache_hits)
        if stats.spec_decoding is not None:
            if self._spec is None:
                self._spec = SpecDecodingProm(self.registry, self.model_name)
            self._spec.observe(stats.spec_decoding)

    def on_output(self, state, num_tokens: int, now: float) -> None:
        """A request gained num_tokens (state: its times before them)."""
        if num_tokens:
            self.generation_tokens.inc(num_tokens)
            gaps = num_tokens
            if state.first_token_time is None:
                self.ttft.observe(now - state.arrival_time)
                gaps -= 1
            elif state.last_token_time is not None:
                for _ in range(gaps):  # tokens that came together share the gap
                    self.tpot.observe((now - state.last_token_time) / num_tokens)
        if state.finish_reason is not None:
            self._success.labels(self.model_name, state.finish_reason).inc()

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class SpecDecodingProm:
    """Speculative decoding's acceptance counters, as upstream's: drafts
    (verifications), draft tokens, accepted tokens in all and by position;
    fed with the core's totals since start."""

    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels, r = ["model_name"], registry
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative verifications (a "
                              "request's step with drafts).", labels, registry=r
                              ).labels(model_name)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens "
                                    "verified.", labels, registry=r).labels(model_name)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens "
                                "accepted.", labels, registry=r).labels(model_name)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens "
                               "accepted, by position in their step's drafts.",
                               labels + ["position"], registry=r)
        self.model_name = model_name
        self._seen = SpecDecodingStats()

    def observe(self, totals: SpecDecodingStats) -> None:
        seen = self._seen
        self.drafts.inc(max(totals.num_drafts - seen.num_drafts, 0))
        self.draft_tokens.inc(max(totals.num_draft_tokens - seen.num_draft_tokens, 0))
        self.accepted.inc(max(totals.num_accepted_tokens - seen.num_accepted_tokens, 0))
        before = seen.num_accepted_tokens_per_pos
        for pos, n in enumerate(totals.num_accepted_tokens_per_pos):
            old = before[pos] if pos < len(before) else 0
            self.per_pos.labels(self.model_name, str(pos)).inc(max(n - old, 0))
        self._seen = SpecDecodingStats(totals.num_drafts, totals.num_draft_tokens,
                                       totals.num_accepted_tokens,
                                       list(totals.num_accepted_tokens_per_pos))
