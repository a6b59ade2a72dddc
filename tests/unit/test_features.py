"""The feature cache's facts (app/stores/features.py): the key, the seeds and the bytes are the
same as every release before wrote them, so entries cached before an upgrade stay valid and the
same request renders the same audio."""

from __future__ import annotations

import hashlib

import torch

from app.stores.features import (
    features_seed,
    mel_cache_key,
    mel_from_bytes,
    mel_to_bytes,
    noise_seed,
    scoped_key,
)

CONTENT = mel_cache_key("espeak", "maɪ bˈæŋk pˈɪn", "en-us", 1.0)


def test_the_key_and_its_scope_are_the_ones_cached_before():
    assert CONTENT == "aad2df1b9e3fabae82a70392b3a201250c6fe30e"
    assert scoped_key(CONTENT, "aaaa1111") == "5b3e9e29d3bc3a761a8747972078ea411b43fbc2"
    assert scoped_key(CONTENT, "") == CONTENT
    # speed to three decimals: what users send
    assert mel_cache_key("espeak", "maɪ bˈæŋk pˈɪn", "en-us", 1.0001) == CONTENT


def test_the_bytes_are_the_format_cached_before():
    blob = mel_to_bytes(torch.tensor([[1.0, -2.0, 0.5]]))
    # magic, version 1, two dimensions (1, 3), then little-endian float16
    assert blob.hex() == "56584d4c01020100000003000000003c00c00038"
    assert torch.equal(mel_from_bytes(blob), torch.tensor([[1.0, -2.0, 0.5]]))


def test_the_seeds_are_the_ones_rendered_before():
    assert noise_seed(CONTENT) == int(CONTENT[:15], 16) == 769321627579316922
    blob = mel_to_bytes(torch.tensor([[1.0, -2.0, 0.5]]))
    assert features_seed(blob) == int(hashlib.sha256(blob).hexdigest()[:15], 16)
    assert features_seed(blob) == 604779715357837429
