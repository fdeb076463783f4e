"""/metrics as vLLM 0.32 exports it for a text model (issue 38): every name,
type, histogram bucket and label set of the peer's own scrape
(tests/data/vllm_0.32_metrics.txt, `vllm serve` on a tiny Llama after a few
requests), and docs/grafana-dashboard.json asks only for names we export."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import REPO

PEER = Path(__file__).parents[1] / "data" / "vllm_0.32_metrics.txt"
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
# the peer's labels that name its configuration, not the series (cache_config_info's)
CONFIG_INFO = "vllm:cache_config_info"


def parse(text: str):
    """(name -> type, series name -> set of label-name tuples, histogram -> buckets)."""
    types, labels, buckets = {}, {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.match(r'^([a-zA-Z0-9_:]+)(?:\{(.*)\})? ', line)
            assert m, line
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if m.group(1).endswith("_bucket"):
                buckets.setdefault(m.group(1), set()).add(pairs.pop("le"))
            labels.setdefault(m.group(1), set()).add(tuple(sorted(pairs)))
    return types, labels, buckets


def ours() -> str:
    """Our registry after one finished request (in process: no server)."""
    from types import SimpleNamespace

    from engine.entrypoints.openai.http_metrics import HttpMetrics
    from engine.entrypoints.openai.metrics import Metrics

    m = Metrics("m", max_model_len=2048)  # the peer ran with max_model_len 2048
    http = HttpMetrics(None, m.registry)
    http.requests.labels("/v1/completions", "POST", "2xx").inc()
    for h in (http.request_size, http.response_size):
        h.labels("/v1/completions").observe(10)
    http.duration.labels("/v1/completions", "POST").observe(0.1)
    state = SimpleNamespace(index=0, params=SimpleNamespace(max_tokens=4), arrival_time=0.0,
                            scheduled_time=0.1, first_token_time=None, last_token_time=None,
                            finish_reason=None, num_cached_tokens=0, num_prompt_tokens=5,
                            num_output_tokens=1, num_preemptions=0, engine_index=0,
                            prompt_counted=False)
    m.on_request([state])
    m.on_output(state, 1, 0.2)
    state.first_token_time, state.last_token_time, state.finish_reason = 0.2, 0.2, "length"
    state.num_output_tokens = 2
    m.on_output(state, 1, 0.3)
    return m.render().decode()


def test_every_name_type_bucket_and_label_of_the_peer():
    p_types, p_labels, p_buckets = parse(PEER.read_text())
    o_types, o_labels, o_buckets = parse(ours())
    assert len(p_types) >= 90
    missing = sorted(set(p_types) - set(o_types))
    assert not missing, missing
    assert {n: t for n, t in p_types.items()} == {n: o_types[n] for n in p_types}
    for name, sets in p_labels.items():
        if not name.startswith(CONFIG_INFO):
            assert o_labels.get(name) == sets, name
    assert {n: b for n, b in p_buckets.items() if not n.startswith("http_")} == \
        {n: o_buckets[n] for n in p_buckets if not n.startswith("http_")}
    assert p_buckets["http_request_duration_highr_seconds_bucket"] == \
        o_buckets["http_request_duration_highr_seconds_bucket"]


def dashboard_names() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert exprs
    names = set()
    for expr in exprs:
        names |= set(re.findall(r"\b((?:vllm:|http_|process_)[a-z0-9_:]+)", expr))
    return names


def test_the_dashboard_asks_only_for_names_we_export():
    o_types, o_labels, _ = parse(ours())
    missing = sorted(dashboard_names() - set(o_labels))
    assert not missing, missing
    queries = json.dumps(json.loads(DASHBOARD.read_text())["panels"])
    for needed in ("e2e_request_latency_seconds", "inter_token_latency_seconds",
                   "request_queue_time_seconds", "time_to_first_token_seconds"):
        assert needed in queries


@pytest.mark.slow
def test_a_served_engine_exports_them(vllm_compat_server):
    """The real server's scrape around a request: the peer's names and
    labels, the request's phases counted once, http_* by route."""
    import httpx2 as httpx

    s = vllm_compat_server
    before = httpx.get(s.url + "/metrics", timeout=10).text
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "one two", "max_tokens": 5,
                                                    "ignore_eos": True}, timeout=60)
    assert r.status_code == 200, r.text
    text = httpx.get(s.url + "/metrics", timeout=10).text
    p_types, p_labels, _ = parse(PEER.read_text())
    o_types, o_labels, _ = parse(text)
    assert not sorted(set(p_types) - set(o_types))
    assert dashboard_names() <= set(o_labels)

    def value(series: str, page: str) -> float:
        m = re.search(rf'^{re.escape(series)}(?:{{[^}}]*}})? (\S+)$', page, re.M)
        return float(m.group(1)) if m else 0.0

    def grew(series: str) -> float:
        return value(series, text) - value(series, before)

    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds"):
        assert grew(f"vllm:{name}_count") == 1, name
    assert grew("vllm:request_generation_tokens_sum") == 5
    assert grew("vllm:inter_token_latency_seconds_count") == 4
    assert re.search(r'^vllm:e2e_request_latency_seconds_count\{engine="0",model_name="tiny"\}',
                     text, re.M)
    assert 'http_requests_total{handler="/v1/completions",method="POST",status="2xx"}' in text


def test_data_parallel_replicas_are_labelled_by_engine_index():
    """-dp 2: the scheduler series carry each replica's index as `engine`
    (upstream's), from the per-replica stats the DP front sends each step; a
    step's tokens are counted once, when its replica stepped."""
    from types import SimpleNamespace

    import msgspec

    from engine.core.messages import SchedulerStats
    from engine.entrypoints.openai.metrics import Metrics
    from engine.executor.data_parallel import DPEngineCore

    m = Metrics("m", engines=2)
    idle = m.render().decode()
    assert 'vllm:num_requests_running{engine="1",model_name="m"} 0.0' in idle
    front = SimpleNamespace(stats=[SchedulerStats(), SchedulerStats()])
    for rank, step in ((1, SchedulerStats(3, 1, 0.5, 40, 8, num_scheduled_tokens=7)),
                       (0, SchedulerStats(1, 0, 0.25, 10, 0, num_scheduled_tokens=2))):
        front.stats[rank] = step
        stats = DPEngineCore.make_stats(front, [msgspec.structs.replace(step, engine_index=rank)])
        m.on_stats(msgspec.msgpack.decode(msgspec.msgpack.encode(stats), type=SchedulerStats))
    text = m.render().decode()
    for line in ('vllm:num_requests_running{engine="1",model_name="m"} 3.0',
                 'vllm:num_requests_running{engine="0",model_name="m"} 1.0',
                 'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5',
                 'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 40.0',
                 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0',
                 'vllm:iteration_tokens_total_sum{engine="1",model_name="m"} 7.0',
                 'vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 2.0',
                 'vllm:num_requests_waiting_by_reason{engine="1",model_name="m",'
                 'reason="capacity"} 1.0'):
        assert line in text, line
    # a request's series: under the replica that ran it (its outputs' engine_index)
    for state in (SimpleNamespace(
            engine_index=1, arrival_time=0.0, scheduled_time=0.5, first_token_time=None,
            last_token_time=None, finish_reason=None, num_cached_tokens=1, num_prompt_tokens=3,
            prompt_counted=False, num_output_tokens=2, num_preemptions=0, request_n=1,
            params=SimpleNamespace(max_tokens=2)) for _ in range(1)):
        m.on_output(state, 1, 1.0)
        state.first_token_time = state.last_token_time = 1.0
        state.finish_reason = "length"
        m.on_output(state, 1, 2.0)
    text = m.render().decode()
    for line in ('vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 1.0',
                 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 0.0',
                 'vllm:generation_tokens_total{engine="1",model_name="m"} 2.0',
                 'vllm:prompt_tokens_total{engine="1",model_name="m"} 3.0',
                 'vllm:request_params_n_count{engine="1",model_name="m"} 1.0',
                 'vllm:request_success_total{engine="1",finished_reason="length",'
                 'model_name="m"} 1.0',
                 'vllm:prompt_tokens_by_source_total{engine="1",model_name="m",'
                 'source="local_compute"} 2.0'):
        assert line in text, line
