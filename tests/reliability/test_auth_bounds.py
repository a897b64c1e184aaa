"""Who may read what with keys configured: every path but /health needs a key (/metrics and /v1/snapshot too, unless
--open-metrics lets a loopback scraper in); `Bearer<TAB>KEY` is the key; a key no header can carry is refused at boot."""

import asyncio

import pytest
import typer

from met.serve.auth import AuthLayer, KeyRing, KeysFileError, bearer, read_keys_file
from met.serve.cli import _keys


def status(ring: KeyRing, path: str, headers=(), client=("127.0.0.1", 5000)) -> int:
    """The status AuthLayer answers a GET of path with (200: let through to the app)."""
    sent = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    scope = {"type": "http", "path": path, "method": "GET", "headers": list(headers), "client": client}
    asyncio.run(AuthLayer(app, ring)(scope, None, send))
    return sent[0]


def test_every_path_but_health_needs_the_key():
    ring = KeyRing({"sk-a": "alice"})
    for path in ("/metrics", "/v1/snapshot", "/v1/models", "/tokenize", "/anything"):
        assert status(ring, path) == 401, path
        assert status(ring, path, [(b"authorization", b"Bearer sk-a")]) == 200, path
    assert status(ring, "/health") == 200  # probes
    assert status(KeyRing({}), "/metrics") == 200  # no keys configured: open


def test_open_metrics_lets_only_a_loopback_scraper_read_metrics_and_the_snapshot():
    ring = KeyRing({"sk-a": "alice"}, open_metrics=True)
    assert status(ring, "/metrics") == 200 and status(ring, "/v1/snapshot", client=("::1", 1)) == 200
    assert status(ring, "/metrics", client=("10.0.0.7", 5000)) == 401  # not loopback
    assert status(ring, "/v1/models") == 401  # only those two


@pytest.mark.parametrize("value, key", [
    (b"Bearer\tsk-a", "sk-a"), (b"Bearer  sk-a ", "sk-a"), (b"bearer sk-a", "sk-a"), (b"Bearer", ""),
    (b"Basic sk-a", None),
])
def test_bearer_takes_any_whitespace_after_the_scheme(value, key):
    assert bearer([(b"authorization", value)]) == key


def test_a_key_no_header_can_carry_is_refused_at_boot(tmp_path):
    # a key outside Latin-1 was accepted and could never authenticate
    f = tmp_path / "keys"
    f.write_text("sk-a alice\nключ bob\n", encoding="utf-8")
    with pytest.raises(KeysFileError, match=r"keys:2: the key has '\\u043a' at character 1, which an HTTP header"):
        read_keys_file(f)
    with pytest.raises(typer.BadParameter, match="which an HTTP header cannot carry"):
        _keys(["sk-\u20ac"], None)
    assert _keys(["sk-caf\xe9"], None).tenant_of("sk-caf\xe9") == "default"  # Latin-1 is sent as its bytes
