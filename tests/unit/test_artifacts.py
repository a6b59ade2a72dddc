"""The directory artifact store: atomic writes, listing, prefix deletes, key checks."""

from __future__ import annotations

import pytest

from app.stores.artifacts import DirectoryStore, open_store


def test_put_overwrites_and_counts_each_key_once(tmp_path):
    store = DirectoryStore(tmp_path)
    for _ in range(3):  # a retried task writes the same segment again
        store.put("books/b1/segments/0000/00001.pcm", b"\x01\x00" * 10)
    store.put("books/b1/segments/0000/00000.pcm", b"\x00\x00")
    assert store.list("books/b1/segments/") == ["books/b1/segments/0000/00000.pcm",
                                                "books/b1/segments/0000/00001.pcm"]
    assert store.size("books/b1/segments/0000/00001.pcm") == 20
    assert not list(tmp_path.rglob("*.tmp")), "no temporary file is left behind"


def test_failed_streaming_write_leaves_nothing(tmp_path):
    store = DirectoryStore(tmp_path)
    with pytest.raises(RuntimeError), store.writer("books/b/out/book.m4b") as f:
        f.write(b"half")
        raise RuntimeError("encoder crashed")
    assert not store.exists("books/b/out/book.m4b")
    assert store.list("books/") == []


def test_delete_prefix_and_missing_keys(tmp_path):
    store = open_store(str(tmp_path))
    store.put("books/a/x", b"1")
    store.put("books/a/y/z", b"2")
    store.put("books/b/x", b"3")
    assert store.delete_prefix("books/a/") == 2
    assert store.list("books/") == ["books/b/x"]
    with pytest.raises(KeyError):
        store.get("books/a/x")
    store.delete("books/a/x")  # absent: no error


@pytest.mark.parametrize("key", ["../etc/passwd", "/abs", "a/../../b", "a//b", ""])
def test_keys_cannot_escape_the_root(tmp_path, key):
    with pytest.raises(ValueError):
        DirectoryStore(tmp_path).put(key, b"x")


def test_sweep_removes_only_abandoned_partial_writes(tmp_path):
    import os
    import time

    store = DirectoryStore(tmp_path)
    store.put("books/b1/out/book.m4b", b"final")
    out = tmp_path / "books" / "b1" / "out"
    dead = out / ".book.mp3.1111.tmp"  # its writer was killed ten minutes ago
    live = out / ".book.m4b.2222.tmp"  # being written right now
    dead.write_bytes(b"partial")
    live.write_bytes(b"partial")
    old = time.time() - 600
    os.utime(dead, (old, old))
    assert store.sweep_abandoned("books/b1/", idle_s=300) == 1
    assert not dead.exists() and live.exists()
    assert store.get("books/b1/out/book.m4b") == b"final"
    assert store.sweep_abandoned("books/none/", idle_s=300) == 0
