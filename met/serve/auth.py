"""API keys: --api-key / --api-keys-file map a bearer key to a tenant; an ASGI layer refuses a bad key with 401.

Keys file: one `KEY TENANT` per line (whitespace between), `#` starts a comment, blank lines are
skipped; a key given twice is an error. `--api-key KEY` adds KEY for tenant "default". A key is
printable Latin-1 without spaces (an HTTP header carries nothing else, so any other key could never
be sent); one that is not is refused at boot. With no key configured the API is open and every
request is tenant "default". The check runs before the body is read, so a request without a valid
key never reaches the scheduler. With keys configured every path needs one but /health (probes);
/metrics and /v1/snapshot too (their figures are the whole server's, never one tenant's or one
request's, but they are still not for whoever can reach the port), unless the ring's
`open_metrics` (--open-metrics) lets a client on loopback (a local scraper) read those two without.
"""

import hmac
import ipaddress
import json
import re
from collections.abc import Mapping
from pathlib import Path

import met.bounded_read as bounded_read
from met.serve.errors import error_body

DEFAULT_TENANT = "default"
_TENANT = re.compile(r"[A-Za-z0-9._@-]{1,64}")


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the file and line."""


def read_keys_file(path: Path) -> dict[str, str]:
    """key -> tenant from a keys file."""
    try:  # an editor's byte-order mark is not part of the first key
        text = bounded_read.read_text(path, bounded_read.KEYS_LIMIT, "utf-8-sig")
    except bounded_read.FileRefused as exc:
        raise KeysFileError(str(exc)) from None
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
        if (why := key_problem(key)) is not None:
            raise KeysFileError(f"{path}:{n}: the key {why}")
        if not _TENANT.fullmatch(tenant):
            raise KeysFileError(f"{path}:{n}: tenant {tenant!r} must be 1-64 of letters, digits, '.', '_', '@', '-'")
        if key in keys:
            raise KeysFileError(f"{path}:{n}: the key is given twice (first for tenant {keys[key]!r})")
        keys[key] = tenant
    if not keys:
        raise KeysFileError(f"{path}: holds no keys")
    return keys


def key_problem(key: str) -> str | None:
    """Why a key could never be sent in an HTTP header (outside printable Latin-1, or a space in it); None if it can."""
    for i, c in enumerate(key):
        if ord(c) > 0xFF or not c.isprintable() or c.isspace():
            return (f"has {ascii(c)} at character {i + 1}, which an HTTP header cannot carry (keys are printable "
                    "Latin-1 without spaces: ASCII letters, digits and punctuation are safe)")
    return None


class KeyRing:
    """The configured keys; `tenant_of` compares in constant time.

    open_metrics: /metrics and /v1/snapshot answer a client on loopback without a key (a local scraper).
    """

    def __init__(self, keys: Mapping[str, str], open_metrics: bool = False) -> None:
        self.keys = dict(keys)
        self.open_metrics = open_metrics
        self._encoded = [(known.encode("latin-1", "replace"), tenant) for known, tenant in self.keys.items()]

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
        sent = key.encode("latin-1", "replace")  # as the header's bytes were decoded
        found = None
        for known, tenant in self._encoded:
            if hmac.compare_digest(known, sent):
                found = tenant
        return found


def bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The key of an `Authorization: Bearer KEY` header (or an `api-key` header), if any."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, *rest = value.decode("latin-1").split(None, 1) or [""]  # `Bearer KEY`, any whitespace between
            if scheme.lower() == "bearer":
                return rest[0].strip() if rest else ""
        if name.lower() == b"api-key":
            return value.decode("latin-1").strip()
    return None


OPEN_PATHS = frozenset({"/health"})  # answered without a key: probes
SCRAPED_PATHS = frozenset({"/metrics", "/v1/snapshot"})  # without a key from loopback under open_metrics


class AuthLayer:
    """ASGI middleware: with keys configured, a request needs a valid key (OPEN_PATHS aside); the tenant goes
    into scope["state"]["tenant"]."""

    def __init__(self, app, ring: KeyRing) -> None:
        self.app = app
        self.ring = ring

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self.ring.open or self._scraper(scope):
            if scope["type"] == "http" and self.ring.open:
                scope.setdefault("state", {})["tenant"] = DEFAULT_TENANT
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

    def _scraper(self, scope) -> bool:
        """A loopback client reading /metrics or /v1/snapshot while open_metrics is on."""
        if not (self.ring.open_metrics and scope["path"] in SCRAPED_PATHS):
            return False
        client = scope.get("client")
        try:
            return client is not None and ipaddress.ip_address(client[0]).is_loopback
        except ValueError:
            return False
