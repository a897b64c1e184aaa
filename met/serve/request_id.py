"""x-request-id: every response carries the id its request was sent with, or one made up for it (as vLLM's)."""

import re
import uuid

_ID = re.compile(rb"[\x21-\x7e]{1,128}")  # visible ASCII: anything else is not echoed into a header


class RequestIdLayer:
    """ASGI middleware: echo the request's x-request-id (a fresh one if it sent none or an unusable one)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((v for k, v in scope.get("headers", []) if k.lower() == b"x-request-id"), None)
        rid = sent if sent is not None and _ID.fullmatch(sent) else uuid.uuid4().hex.encode()

        async def tagged(message) -> None:
            if message["type"] == "http.response.start":
                message = message | {"headers": [*message.get("headers", []), (b"x-request-id", rid)]}
            await send(message)

        await self.app(scope, receive, tagged)
