"""API keys: the keys file maps keys to tenants; bad files are refused with the line that is wrong."""

import pytest

from met.serve.auth import KeyRing, KeysFileError, read_keys_file


def test_keys_file_maps_keys_to_tenants(tmp_path):
    # comments and blank lines skipped; each key's tenant; unknown keys have none
    f = tmp_path / "keys"
    f.write_text("# key tenant\nsk-a alice\n\nsk-b bob  # ops\n")
    ring = KeyRing(read_keys_file(f))
    assert (ring.tenant_of("sk-a"), ring.tenant_of("sk-b"), ring.tenant_of("sk-c"), ring.tenant_of(None)) == \
        ("alice", "bob", None, None)
    assert KeyRing({}).tenant_of(None) == "default"  # no keys configured: open, one tenant


def test_a_keys_file_saved_with_a_byte_order_mark_keeps_its_first_key(tmp_path):
    # an editor's BOM and CRLF line ends: the first key is sk-a, not "\ufeffsk-a"
    f = tmp_path / "keys"
    f.write_bytes(b"\xef\xbb\xbfsk-a alice\r\nsk-b bob\r\n")
    assert read_keys_file(f) == {"sk-a": "alice", "sk-b": "bob"}


@pytest.mark.parametrize("text, words", [
    ("sk-a\n", "expected `KEY TENANT`"),  # a key without a tenant
    ("sk-a alice\nsk-a bob\n", "given twice"),  # one key, two tenants
    ("sk-a al/ice\n", "tenant"),  # a tenant name that is not a plain name
    ("# nothing\n", "no keys"),  # an empty file would silently open the server
])
def test_bad_keys_files_are_refused(tmp_path, text, words):
    f = tmp_path / "keys"
    f.write_text(text)
    with pytest.raises(KeysFileError, match=words):
        read_keys_file(f)
