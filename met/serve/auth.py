"""API keys: --api-key / --api-keys-file map a bearer key to a tenant; an ASGI layer refuses a bad key with 401.

Keys file: one `KEY TENANT` per line (whitespace between), `#` starts a comment, blank lines are
skipped; a key given twice is an error. `--api-key KEY` adds KEY for tenant "default". With no
key configured the API is open and every request is tenant "default". The check runs before the
body is read, so a request without a valid key never reaches the scheduler. /health and /metrics
stay open (probes and scrapers); every /v1/ path needs a key when keys are configured.
"""

import hmac
import json
import re
from collections.abc import Mapping
from pathlib import Path

from met.serve.errors import error_body

DEFAULT_TENANT = "default"
_TENANT = re.compile(r"[A-Za-z0-9._@-]{1,64}")


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the file and line."""


def read_keys_file(path: Path) -> dict[str, str]:
    """key -> tenant from a keys file."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # an editor's byte-order mark is not part of the first key
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysFileError(f"{path}: cannot be read ({exc})") from None
    keys: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise KeysFileError(f"{path}:{n}: expected `KEY TENANT`, got {len(parts)} fields")
        key, tenant = parts
        if not _TENANT.fullmatch(tenant):
            raise KeysFileError(f"{path}:{n}: tenant {tenant!r} must be 1-64 of letters, digits, '.', '_', '@', '-'")
        if key in keys:
            raise KeysFileError(f"{path}:{n}: the key is given twice (first for tenant {keys[key]!r})")
        keys[key] = tenant
    if not keys:
        raise KeysFileError(f"{path}: holds no keys")
    return keys


class KeyRing:
    """The configured keys; `tenant_of` compares in constant time."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self.keys = dict(keys)

    @property
    def open(self) -> bool:
        """No key configured: every request is let in as the default tenant."""
        return not self.keys

    def tenant_of(self, key: str | None) -> str | None:
        """The tenant of a presented key, None if it is not valid."""
        if self.open:
            return DEFAULT_TENANT
        if not key:
            return None
        found = None
        for known, tenant in self.keys.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                found = tenant
        return found


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key of an `Authorization: Bearer KEY` header (or an `api-key` header), if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, key = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return key.strip()
        if name.lower() == b"api-key":
            return value.decode("latin-1").strip()
    return None


class AuthLayer:
    """ASGI middleware: /v1/ requests need a valid key; the tenant goes into scope["state"]["tenant"]."""

    def __init__(self, app, ring: KeyRing) -> None:
        self.app = app
        self.ring = ring

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        key = bearer(scope.get("headers", []))
        tenant = self.ring.tenant_of(key)
        if tenant is None:
            why = "no API key was sent" if not key else "the API key is not valid"
            body = json.dumps(error_body(401, f"{why}; send `Authorization: Bearer KEY` with a key this "
                                         "server was started with", "invalid_api_key")).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)
