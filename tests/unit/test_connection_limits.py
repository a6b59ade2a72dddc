"""The web worker's per-address bound as a decision (ops/gevent_worker.py): each worker's
share, the count, and whose address a trusted proxy's request counts for."""

from __future__ import annotations

import json

import pytest

from ops.gevent_worker import ConnectionLimits, PeerCounts, counted_as, parse_networks, refusal


def test_each_worker_allows_its_share_rounded_up():
    assert ConnectionLimits.share(512, 2).per_address == 256
    assert ConnectionLimits.share(512, 3).per_address == 171
    assert ConnectionLimits.share(0, 2).per_address == 0  # off


def test_an_address_is_refused_past_its_share_and_served_again_once_one_closes():
    counts = PeerCounts(2)
    assert counts.take("10.0.0.1") and counts.take("10.0.0.1")
    assert not counts.take("10.0.0.1")
    assert counts.take("10.0.0.2")  # another address is not held back
    counts.give("10.0.0.1")
    assert counts.take("10.0.0.1")
    for _ in range(3):
        counts.give("10.0.0.1")
    assert "10.0.0.1" not in counts.held  # nothing left behind for an address gone


def test_forwarded_for_is_believed_from_trusted_proxies_only():
    limits = ConnectionLimits(trusted_proxies=parse_networks("10.0.0.0/8, 192.168.1.7"))
    # The last hop that is not a trusted proxy: a client cannot pick its address by
    # sending X-Forwarded-For itself (the proxy appends what it saw).
    assert limits.forwarded_client("10.1.2.3", "6.6.6.6, 203.0.113.9") == "203.0.113.9"
    assert limits.forwarded_client("192.168.1.7", "203.0.113.9, 10.4.4.4") == "203.0.113.9"
    assert limits.forwarded_client("198.51.100.1", "203.0.113.9") == "198.51.100.1"
    assert limits.forwarded_client("10.1.2.3", "") == "10.1.2.3"
    assert limits.forwarded_client("10.1.2.3", "garbage, 10.0.0.5") == "garbage"
    assert not ConnectionLimits().trusted("127.0.0.1")  # off by default


def test_a_bad_proxy_entry_is_named():
    with pytest.raises(ValueError, match="'10.0.0.300'"):
        parse_networks("10.0.0.0/8, 10.0.0.300")


def test_the_refusal_is_a_429_in_the_one_error_shape():
    head, _, body = refusal(ConnectionLimits(per_address=256)).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 ")
    assert b"Retry-After: 1\r\n" in head and b"Connection: close" in head
    assert json.loads(body)["error"]["code"] == "too_many_connections"


def test_an_ipv6_client_is_counted_by_its_64_block():
    # One host is handed a /64: counted by address, it could open each connection from a
    # fresh one.
    assert counted_as("2001:db8:1:2::1") == counted_as("2001:db8:1:2:ffff::9") \
        == "2001:db8:1:2::/64"
    assert counted_as("2001:db8:1:3::1") != counted_as("2001:db8:1:2::1")
    assert counted_as("::ffff:10.1.2.3") == "10.1.2.3"
    assert counted_as("10.1.2.3") == "10.1.2.3"
