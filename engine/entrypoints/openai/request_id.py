"""The X-Request-Id header (upstream's XRequestIdMiddleware): a client's id
comes back on the answer, and names the request in the engine and in the
answer's `id` (serving_engine.request_id); with --enable-request-id-headers
every answer carries one. Plain ASGI, not BaseHTTPMiddleware: that one hides
a client's disconnect from the endpoint, and a disconnect must abort."""
from __future__ import annotations

import uuid

HEADER = b"x-request-id"


def header_id(headers) -> str | None:
    """The client's X-Request-Id (Starlette's headers), if it sent one."""
    value = headers.get("x-request-id")
    return value or None


class RequestIdHeader:
    def __init__(self, app, always: bool = False):
        self.app, self.always = app, always

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k == HEADER), None)
        if given is None and not self.always:
            return await self.app(scope, receive, send)
        value = given or uuid.uuid4().hex.encode()

        async def with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, value)]
            await send(message)

        await self.app(scope, receive, with_id)
