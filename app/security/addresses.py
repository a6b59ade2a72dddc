"""What a client address is counted as, wherever the web bounds one client's share.

The per-address connection cap (ops/gevent_worker.py), the open waits (web/waits.py) and the
WebSockets (web/ws.py) of a farm without keys all count a client by its address. An IPv4
address counts as itself; an IPv6 address by its /64, the block one site or one host is
handed, since a client could otherwise pick a fresh address from it for each connection;
an IPv4-mapped IPv6 address as its IPv4 address.
"""

from __future__ import annotations

import ipaddress


def counted_as(address: str) -> str:
    """The address, or its IPv6 /64, as the caps count it; anything unparsable as it is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return address
