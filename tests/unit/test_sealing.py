"""At-rest sealing: round trip, rotation, and every way a blob must fail to open (issue 11)."""

from __future__ import annotations

import base64
import logging

import numpy as np
import pytest

from app.sealing import MAGIC, Sealer, generate_key, parse_keyring

CONTEXT = b"vf:chunk:job-1:0"


def pcm_payload(seconds: float = 0.5, rate: int = 22050) -> bytes:
    """Speech-like int16 PCM: a 220 Hz tone, as a chunk store would hold it."""
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 220 * t) * 12000).astype("<i2").tobytes()


def test_round_trip_binds_the_sealing_key_and_hides_the_payload():
    sealer = Sealer.from_keyring(generate_key("k1"))
    pcm = pcm_payload()
    blob = sealer.seal(pcm, CONTEXT)
    assert blob.startswith(MAGIC + b"\x02k1")
    assert len(blob) == len(pcm) + len(MAGIC) + 1 + 2 + 12 + 16
    assert sealer.open(blob, CONTEXT) == pcm
    assert sealer.open(blob, CONTEXT.decode()) == pcm  # a str context is its UTF-8
    # Two seals of the same payload differ (fresh nonce each time).
    assert sealer.seal(pcm, CONTEXT) != blob


def test_no_plaintext_pcm_is_visible_in_the_blob():
    sealer = Sealer.from_keyring(generate_key("k1"))
    pcm = pcm_payload()
    blob = sealer.seal(pcm, CONTEXT)
    # No 16-byte run of the PCM, anywhere, at any alignment.
    windows = {pcm[i:i + 16] for i in range(0, len(pcm) - 16, 7)}
    assert not any(blob[i:i + 16] in windows for i in range(len(blob) - 16))
    # And the blob reads as noise: every byte value about equally often.
    counts = np.bincount(np.frombuffer(blob, np.uint8), minlength=256)
    assert counts.max() < 3 * len(blob) / 256


def test_rotation_old_blobs_open_new_seals_use_the_new_key():
    old, new = generate_key("old"), generate_key("new")
    blob_old = Sealer.from_keyring(old).seal(b"features", CONTEXT)
    rotated = Sealer.from_keyring(f"{new},{old}")
    assert rotated.sealing_key_id == "new"
    assert rotated.open(blob_old, CONTEXT) == b"features"
    blob_new = rotated.seal(b"features", CONTEXT)
    assert blob_new.startswith(MAGIC + b"\x03new")
    # Once the old key is dropped, its blobs are misses; the new ones still open.
    retired = Sealer.from_keyring(new)
    assert retired.open(blob_old, CONTEXT) is None
    assert retired.open(blob_new, CONTEXT) == b"features"
    assert retired.failures == {("old", "unknown_key"): 1}


def test_every_tampered_byte_fails_to_open():
    sealer = Sealer.from_keyring(generate_key("k1"))
    blob = sealer.seal(b"a short segment of text", CONTEXT)
    for i in range(len(blob)):
        tampered = bytearray(blob)
        tampered[i] ^= 0x01
        assert sealer.open(bytes(tampered), CONTEXT) is None, f"byte {i}"
    assert sealer.open(blob[:-1], CONTEXT) is None  # truncated
    assert sealer.open(blob + b"\x00", CONTEXT) is None  # extended
    assert sealer.open(blob[:len(MAGIC) + 3], CONTEXT) is None  # header only
    assert sealer.open(MAGIC, CONTEXT) is None


def test_a_blob_moved_to_another_key_name_fails():
    sealer = Sealer.from_keyring(generate_key("k1"))
    blob = sealer.seal(b"mel", b"vf:mel:aaaa")
    assert sealer.open(blob, b"vf:mel:bbbb") is None
    assert sealer.failures == {("k1", "unauthentic"): 1}


def test_a_key_of_the_same_id_but_other_bytes_fails():
    blob = Sealer.from_keyring(generate_key("k1")).seal(b"mel", CONTEXT)
    assert Sealer.from_keyring(generate_key("k1")).open(blob, CONTEXT) is None


def test_unknown_key_id_fails_and_warns_once(caplog):
    blob = Sealer.from_keyring(generate_key("gone")).seal(b"chunk", CONTEXT)
    sealer = Sealer.from_keyring(generate_key("k1"))
    with caplog.at_level(logging.WARNING, logger="app.sealing"):
        for _ in range(3):
            assert sealer.open(blob, CONTEXT) is None
    assert sealer.failures == {("gone", "unknown_key"): 3}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "gone" in warnings[0].getMessage()


def test_plaintext_written_before_keys_were_set_is_a_miss():
    sealer = Sealer.from_keyring(generate_key("k1"))
    assert sealer.open(pcm_payload(0.01), CONTEXT) is None
    assert sealer.failures == {("", "not_sealed"): 1}


def test_no_keys_pass_through_but_refuse_sealed_blobs():
    plain = Sealer.from_keyring("")
    assert not plain.enabled and plain.sealing_key_id is None
    pcm = pcm_payload(0.01)
    assert plain.seal(pcm, CONTEXT) is pcm
    assert plain.open(pcm, CONTEXT) is pcm
    # A sealed blob read after the keys were removed is a miss, not noise played as audio.
    sealed = Sealer.from_keyring(generate_key("k1")).seal(pcm, CONTEXT)
    assert plain.open(sealed, CONTEXT) is None
    assert Sealer.from_keyring("  ").enabled is False


def test_generate_key_makes_a_valid_entry():
    key_id, _, encoded = generate_key("k2").partition(":")
    assert key_id == "k2" and len(base64.b64decode(encoded)) == 32
    assert parse_keyring(generate_key())[0][0].startswith("k")  # dated default id
    assert generate_key("a") != generate_key("a")
    with pytest.raises(ValueError, match="key id"):
        generate_key("bad id")


KEY = base64.b64encode(bytes(32)).decode()


@pytest.mark.parametrize("keyring, message", [
    ("k1", "no ':'"),
    (f":{KEY}", "key id"),
    (f"bad id:{KEY}", "key id"),
    (f"{'x' * 33}:{KEY}", "key id"),
    (f"k1:{KEY},k1:{KEY}", r"key 2 \('k1'\).*used twice"),
    ("k1:not*base64", "not valid base64"),
    (f"k1:{base64.b64encode(bytes(16)).decode()}", "16 bytes; AES-256 needs 32"),
    (f"k1:{KEY},", "key 2: expected"),
])
def test_keyring_errors_name_the_entry_not_the_key(keyring, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_keyring(keyring)
    assert KEY not in str(err.value)


def test_keyring_parsing_tolerates_spaces():
    keys = parse_keyring(f" k1 : {KEY} , k2:{KEY}\n")
    assert [key_id for key_id, _ in keys] == ["k1", "k2"]
    assert keys[0][1] == bytes(32)
