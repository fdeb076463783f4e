"""The http_* series of /metrics, as upstream's prometheus-fastapi-instrumentator
defaults write them: requests by handler (the route's template), method and
status class; request and response sizes (their Content-Length); latency,
with many buckets and no labels, and with few buckets by handler. The probes
and /metrics itself are left out, as upstream leaves them. Plain ASGI, not
BaseHTTPMiddleware: that one hides a client's disconnect from the endpoint."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from starlette.routing import Match

EXCLUDED = {"/metrics", "/health", "/load", "/ping", "/version", "/server_info"}
HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4,
                 4.5, 5, 7.5, 10, 30, 60)
FEW_BUCKETS = (0.1, 0.5, 1)


class HttpMetrics:
    def __init__(self, app, registry: CollectorRegistry):
        self.app = app
        self.requests = Counter("http_requests", "Total number of requests by method, status "
                                "and handler.", ["handler", "method", "status"], registry=registry)
        self.request_size = Summary("http_request_size_bytes", "Content length of incoming "
                                    "requests by handler. Only value of header is respected. "
                                    "Otherwise ignored.", ["handler"], registry=registry)
        self.response_size = Summary("http_response_size_bytes", "Content length of outgoing "
                                     "responses by handler. Only value of header is respected. "
                                     "Otherwise ignored.", ["handler"], registry=registry)
        self.highr = Histogram("http_request_duration_highr_seconds", "Latency with many "
                               "buckets but no API specific labels.", buckets=HIGHR_BUCKETS,
                               registry=registry)
        self.duration = Histogram("http_request_duration_seconds", "Latency with only few "
                                  "buckets by handler.", ["handler", "method"],
                                  buckets=FEW_BUCKETS, registry=registry)

    def _handler(self, scope) -> str:
        for route in scope["app"].routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return route.path
        return "none"  # untemplated paths grouped, as upstream's

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        status, sent_size = [500], [0]

        async def watch(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                for k, v in message.get("headers", ()):
                    if k == b"content-length":
                        sent_size[0] = int(v)
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            handler = self._handler(scope)
            if handler not in EXCLUDED:
                took = time.perf_counter() - t0
                size = next((int(v) for k, v in scope["headers"] if k == b"content-length"
                             and v.isdigit()), 0)
                method = scope["method"]
                self.requests.labels(handler, method, f"{str(status[0])[0]}xx").inc()
                self.request_size.labels(handler).observe(size)
                self.response_size.labels(handler).observe(sent_size[0])
                self.highr.observe(took)
                self.duration.labels(handler, method).observe(took)
