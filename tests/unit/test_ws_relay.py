"""The WebSocket's relay reads a peer's long-poll answers (web/ws_relay.py): a chunk as the
chunk page carries it (web/api.py, a base64 WAV among its fields) comes back as the chunk the
peer stored, so a relayed job's events and PCM frames are a local job's."""

from __future__ import annotations

import json

import numpy as np

from app.stores.job_audio import Chunk
from web.api import _chunk_view
from web.ws_relay import decode_chunk


def test_a_chunk_crosses_the_long_poll_whole():
    rate = 22_050
    pcm = (np.sin(np.arange(rate // 10) / 7.0) * 8000).astype("<i2").tobytes()
    chunk = Chunk(index=3, pcm=pcm, segment=1, window=2, segment_end=False, start_s=1.25,
                  words=[{"word": "river", "start": 1.3, "end": 1.62}])
    page_entry = json.loads(json.dumps(_chunk_view(chunk, rate)))  # as it crosses HTTP
    back, back_rate = decode_chunk(page_entry)
    assert back_rate == rate
    assert back == chunk


def test_a_segments_last_window_keeps_its_end_and_an_unknown_start():
    chunk = Chunk(index=0, pcm=b"\x01\x00" * 480, segment=0, window=0, segment_end=True,
                  start_s=None, words=[])
    back, _ = decode_chunk(json.loads(json.dumps(_chunk_view(chunk, 24_000))))
    assert back == chunk
