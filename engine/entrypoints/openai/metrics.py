"""The server's Prometheus metrics, as vLLM 0.32 exports them for a text
model: the same names, types, buckets and labels (`model_name`, `engine`),
so that upstream's Grafana dashboards read them (docs/grafana-dashboard.json
does; tests/data holds the peer's list). Series for what this engine has no
part of (multi-modal and external caches, sleep mode, LoRA) are exported at
their idle values, as upstream exports them when unused. With several API
server processes (--api-server-count), each writes its values to
$PROMETHEUS_MULTIPROC_DIR and /metrics sums them (prometheus_client's
multiprocess mode, as upstream's)."""
from __future__ import annotations

import os
from collections import Counter as Tally

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from engine.spec_decode.metrics import SpecDecodingStats

# upstream's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
N_BUCKETS = (1, 2, 5, 10, 20)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
ENGINE = "0"  # one engine's label (-dp N: each replica's index)
# per-request series: labelled by the replica that ran the request
REQUEST_SERIES = ("prompt_tokens", "generation_tokens", "cached", "req_prompt", "req_generation",
                  "max_gen", "params_n", "params_max_tokens", "ttft", "itl", "tpot", "e2e",
                  "queue", "inference", "prefill", "decode", "req_preemptions", "kv_computed")


def token_buckets(max_model_len: int) -> list[int]:
    """1, 2, 5, 10, 20, ... up to max_model_len, as upstream's build_1_2_5_buckets."""
    out: list[int] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > max_model_len:
                return out
            out.append(v)
        exp += 1


class Metrics:
    """Fed by the engine client: the scheduler stats each step's output
    carries (on_stats), each request's outputs (on_output); and by the
    request handlers (on_prompt, on_request). One registry per server."""

    def __init__(self, model_name: str, engine_totals: bool = True, max_model_len: int = 2048,
                 cache_info: dict | None = None, engines: int = 1):
        """engine_totals: count the core's totals (the prefix cache's
        lookups, preemptions, steps) here; of N API servers, which all hear
        them, one does. engines: the data-parallel replicas, whose scheduler
        series each carry their index as `engine`, as upstream's."""
        self.engine_totals = engine_totals
        self.model_name = model_name
        self.registry = r = CollectorRegistry()
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)  # process_* and python_*, as upstream's default registry
        names = ["model_name", "engine"]

        def gauge(name, doc, extra=(), per_engine=False):
            g = Gauge(name, doc, names + list(extra), registry=r, multiprocess_mode="mostrecent")
            return g if extra or per_engine else g.labels(model_name, ENGINE)

        def counter(name, doc, extra=(), per_engine=False):
            c = Counter(name, doc, names + list(extra), registry=r)
            return c if extra or per_engine else c.labels(model_name, ENGINE)

        def histogram(name, doc, buckets):  # all per engine: labelled by _Engine
            return Histogram(name, doc, names, buckets=buckets, registry=r)

        # the scheduler's series: families, labelled per replica by _Engine
        self.running = gauge("vllm:num_requests_running",
                             "Number of requests in model execution batches.", per_engine=True)
        self.waiting = gauge("vllm:num_requests_waiting",
                             "Number of requests waiting to be processed.", per_engine=True)
        self.waiting_by = gauge("vllm:num_requests_waiting_by_reason",
                                "Number of waiting requests by reason.", ["reason"])
        self.sleep = gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 1 means the "
                           "engine is awake (this engine does not sleep).", ["sleep_state"])
        self.kv_usage = gauge("vllm:kv_cache_usage_perc",
                              "KV-cache usage. 1 means 100 percent usage.", per_engine=True)
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prefix cache queries, in "
                                      "terms of number of queried tokens.", per_engine=True)
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of "
                                   "number of cached tokens.", per_engine=True)
        for name, doc in (("vllm:external_prefix_cache_queries", "External prefix cache "
                           "queries (no KV connector here: 0)."),
                          ("vllm:external_prefix_cache_hits", "External prefix cache hits (0)."),
                          ("vllm:mm_cache_queries", "Multi-modal cache queries (text only: 0)."),
                          ("vllm:mm_cache_hits", "Multi-modal cache hits (text only: 0)."),
                          ("vllm:estimated_flops_per_gpu", "Estimated floating point "
                           "operations per GPU (not estimated here: 0)."),
                          ("vllm:estimated_read_bytes_per_gpu", "Estimated bytes read per GPU "
                           "(not estimated here: 0)."),
                          ("vllm:estimated_write_bytes_per_gpu", "Estimated bytes written per "
                           "GPU (not estimated here: 0).")):
            counter(name, doc)
        self.preemptions = counter("vllm:num_preemptions",
                                   "Cumulative number of preemption from the engine.",
                                   per_engine=True)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     per_engine=True)
        self.by_source = counter("vllm:prompt_tokens_by_source",
                                 "Number of prompt tokens by source.", ["source"])
        self.cached = counter("vllm:prompt_tokens_cached",
                              "Number of cached prompt tokens (local + external).",
                              per_engine=True)
        self.cached_by = counter("vllm:prompt_tokens_cached_by_source",
                                 "Prefix-cache hit tokens by the cache tier that supplied them.",
                                 ["source"])
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.", per_engine=True)
        self._success = counter("vllm:request_success",
                                "Count of successfully processed requests.", ["finished_reason"])
        # upstream's one series without `engine`: the front end refuses, not an engine
        rejected = Counter("vllm:admission_rejections", "Number of admission attempts rejected "
                           "by a queue limit, by reason.", ["model_name", "reason"], registry=r)
        self.rejected = rejected.labels(model_name, "max_num_queued_reqs")
        rejected.labels(model_name, "max_num_queued_tokens")
        tokens = token_buckets(max_model_len)
        self.req_prompt = histogram("vllm:request_prompt_tokens",
                                    "Number of prefill tokens processed.", tokens)
        self.req_generation = histogram("vllm:request_generation_tokens",
                                        "Number of generation tokens processed.", tokens)
        self.iteration = histogram("vllm:iteration_tokens_total", "Histogram of number of "
                                   "tokens per engine_step.", ITERATION_BUCKETS)
        self.max_gen = histogram("vllm:request_max_num_generation_tokens", "Histogram of maximum "
                                 "number of requested generation tokens.", tokens)
        self.params_n = histogram("vllm:request_params_n",
                                  "Histogram of the n request parameter.", N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens", "Histogram of the "
                                           "max_tokens request parameter.", tokens)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.",
                              ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", PHASE_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               PHASE_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.",
                                   PHASE_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 PHASE_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.",
                                PHASE_BUCKETS)
        self.req_preemptions = histogram("vllm:request_num_preemptions", "Histogram of the "
                                         "number of times a request was preempted.",
                                         PREEMPTION_BUCKETS)
        self.kv_computed = histogram("vllm:request_prefill_kv_computed_tokens",
                                     "Histogram of new KV tokens computed during prefill "
                                     "(excluding cached tokens).", tokens)
        info = {k: str(v) for k, v in (cache_info or {}).items()}
        self.cache_info = Gauge("vllm:cache_config_info", "Information of the LLMEngine "
                                "CacheConfig", ["engine", *info], registry=r,
                                multiprocess_mode="mostrecent")
        self._info = list(info.values())
        self.spec: SpecDecodingProm | None = None  # once a step reports speculation
        self._engines: dict[int, _Engine] = {}
        for index in range(engines):  # each replica's series, at their idle values
            self._engine(index)

    def _engine(self, index: int) -> _Engine:
        if index not in self._engines:
            self._engines[index] = _Engine(self, str(index))
            self.cache_info.labels(str(index), *self._info).set(1)
        return self._engines[index]

    def on_request(self, seqs) -> None:
        """A request's sequences, admitted: each learns its request's n (observed
        with the rest when it ends, under the engine that ran it)."""
        tally, seen = Tally(s.index for s in seqs), set()
        for s in seqs:  # one n a prompt (index: the prompt's), on its first sequence
            s.request_n = 0 if s.index in seen else tally[s.index]
            seen.add(s.index)

    def on_stats(self, stats) -> None:
        """A step's SchedulerStats (engine/core/messages.py); totals since
        start. -dp N: each replica's (stats.replicas), by its engine index."""
        for one in stats.replicas or [stats]:
            self._engine(one.engine_index).on_stats(one, self.engine_totals)

    def on_output(self, state, num_tokens: int, now: float) -> None:
        """A request gained num_tokens (state: its times before them)."""
        e = self._engine(state.engine_index).series
        if num_tokens:
            e["generation_tokens"].inc(num_tokens)
            gaps = num_tokens
            if state.first_token_time is None:
                e["ttft"].observe(now - state.arrival_time)
                self._prompt_done(e, state)
                gaps -= 1
            elif state.last_token_time is not None:
                for _ in range(gaps):  # tokens that came together share the gap
                    e["itl"].observe((now - state.last_token_time) / num_tokens)
        if state.finish_reason is not None:
            self._prompt_done(e, state)  # a pooling request: no token, its prompt now
            self._success.labels(self.model_name, str(state.engine_index),
                                 state.finish_reason).inc()
            self._finished(e, state, now)

    def _prompt_done(self, e: dict, state) -> None:
        if state.prompt_counted:
            return
        state.prompt_counted = True
        cached = state.num_cached_tokens
        computed = state.num_prompt_tokens - cached
        label = str(state.engine_index)
        e["prompt_tokens"].inc(state.num_prompt_tokens)
        e["cached"].inc(cached)
        self.cached_by.labels(self.model_name, label, "device").inc(cached)
        self.by_source.labels(self.model_name, label, "local_cache_hit").inc(cached)
        self.by_source.labels(self.model_name, label, "local_compute").inc(computed)
        e["kv_computed"].observe(computed)

    def _finished(self, e: dict, state, now: float) -> None:
        """Upstream's per-request phases: queued (arrival to first scheduled),
        prefill (to the first token), decode (to the last), inference (both)."""
        scheduled = state.scheduled_time or state.arrival_time
        first = state.first_token_time or now
        e["e2e"].observe(now - state.arrival_time)
        e["queue"].observe(max(scheduled - state.arrival_time, 0.0))
        e["prefill"].observe(max(first - scheduled, 0.0))
        e["decode"].observe(max(now - first, 0.0))
        e["inference"].observe(max(now - scheduled, 0.0))
        e["req_prompt"].observe(state.num_prompt_tokens)
        e["req_generation"].observe(state.num_output_tokens)
        e["req_preemptions"].observe(state.num_preemptions)
        e["params_max_tokens"].observe(state.params.max_tokens)
        e["max_gen"].observe(state.params.max_tokens)
        if state.request_n:
            e["params_n"].observe(state.request_n)
        if state.num_output_tokens > 1:
            e["tpot"].observe((now - first) / (state.num_output_tokens - 1))

    def render(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class _Engine:
    """One engine's (data-parallel replica's) scheduler series, and the core's
    totals as last seen, which its counters advance by."""

    def __init__(self, m: Metrics, index: str):
        v = (m.model_name, index)
        self.metrics, self.index = m, index
        self.running, self.waiting = m.running.labels(*v), m.waiting.labels(*v)
        self.waiting_by = m.waiting_by.labels(*v, "capacity")
        m.waiting_by.labels(*v, "deferred")
        for state, awake in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            m.sleep.labels(*v, state).set(awake)
        self.kv_usage = m.kv_usage.labels(*v)
        self.prefix_queries = m.prefix_queries.labels(*v)
        self.prefix_hits = m.prefix_hits.labels(*v)
        self.preemptions, self.iteration = m.preemptions.labels(*v), m.iteration.labels(*v)
        self.series = {name: getattr(m, name).labels(*v) for name in REQUEST_SERIES}
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            m.by_source.labels(*v, source)
        m.cached_by.labels(*v, "device")
        for reason in FINISHED_REASONS:
            m._success.labels(*v, reason)
        self._seen = (0, 0, 0)  # the core's totals at the last step: queries, hits, preemptions

    def on_stats(self, stats, totals: bool) -> None:
        self.running.set(stats.num_running_reqs)
        self.waiting.set(stats.num_waiting_reqs)
        self.waiting_by.set(stats.num_waiting_reqs)
        self.kv_usage.set(stats.kv_cache_usage)
        if not totals:
            return
        queries, hits, preempted = self._seen
        self.prefix_queries.inc(max(stats.prefix_cache_queries - queries, 0))
        self.prefix_hits.inc(max(stats.prefix_cache_hits - hits, 0))
        self.preemptions.inc(max(stats.num_preemptions - preempted, 0))
        self._seen = (stats.prefix_cache_queries, stats.prefix_cache_hits,
                      stats.num_preemptions)
        if stats.num_scheduled_tokens:
            self.iteration.observe(stats.num_scheduled_tokens)
        if stats.spec_decoding is not None:
            m = self.metrics
            if m.spec is None:
                m.spec = SpecDecodingProm(m.registry, m.model_name)
            m.spec.observe(stats.spec_decoding, self.index)


class SpecDecodingProm:
    """Speculative decoding's acceptance counters, as upstream's: drafts
    (verifications), draft tokens, accepted tokens in all and by position;
    fed with each engine's totals since start."""

    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels, r = ["model_name", "engine"], registry
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative verifications (a "
                              "request's step with drafts).", labels, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens "
                                    "verified.", labels, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens "
                                "accepted.", labels, registry=r)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Draft tokens "
                               "accepted, by position in their step's drafts.",
                               labels + ["position"], registry=r)
        self.model_name = model_name
        self._seen: dict[str, SpecDecodingStats] = {}  # by engine

    def observe(self, totals: SpecDecodingStats, engine: str = ENGINE) -> None:
        seen = self._seen.get(engine, SpecDecodingStats())
        v = (self.model_name, engine)
        self.drafts.labels(*v).inc(max(totals.num_drafts - seen.num_drafts, 0))
        self.draft_tokens.labels(*v).inc(max(totals.num_draft_tokens - seen.num_draft_tokens, 0))
        self.accepted.labels(*v).inc(max(totals.num_accepted_tokens - seen.num_accepted_tokens,
                                         0))
        before = seen.num_accepted_tokens_per_pos
        for pos, n in enumerate(totals.num_accepted_tokens_per_pos):
            old = before[pos] if pos < len(before) else 0
            self.per_pos.labels(*v, str(pos)).inc(max(n - old, 0))
        self._seen[engine] = SpecDecodingStats(totals.num_drafts, totals.num_draft_tokens,
                                               totals.num_accepted_tokens,
                                               list(totals.num_accepted_tokens_per_pos))
