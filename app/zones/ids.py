"""Farm names, the ids that carry them, and the peers setting.

With `farm_name` set, a job's or book's id is `NAME-HEX` (`b-3f2a...`): any farm of a set
knows from the id alone which farm owns the record. A lone farm's ids stay a bare uuid4 hex,
which holds no "-", so `owner_of` finds no owner in them.

The settings validate `VOXFARM_FARM_NAME` and `VOXFARM_PEERS` with these functions, so this
module imports nothing of the farm.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

# A farm's name: short, lower case, no "-" (the separator of its ids), safe in a metric label
# and a header.
FARM_NAME = re.compile(r"[a-z][a-z0-9]{0,15}")
FARM_NAME_RULE = "a lower-case letter, then up to 15 lower-case letters or digits"


@dataclass(frozen=True)
class PeerConfig:
    """One peer farm as the settings name it: its name and its base URL (no trailing "/")."""

    name: str
    url: str


def is_farm_name(name: str) -> bool:
    return bool(FARM_NAME.fullmatch(name))


def new_id(farm_name: str) -> str:
    """A new job or book id: `NAME-HEX` with a farm name, the bare hex without one."""
    hex_id = uuid.uuid4().hex
    return f"{farm_name}-{hex_id}" if farm_name else hex_id


def owner_of(resource_id: str) -> str | None:
    """The farm an id names (the part before its first "-" when that is a farm name), else
    None: a lone farm's id, or one no farm made."""
    prefix, dash, _ = resource_id.partition("-")
    return prefix if dash and is_farm_name(prefix) else None


def parse_peers(value: str) -> tuple[PeerConfig, ...]:
    """`"name=url,name=url"` as PeerConfigs, in order. ValueError naming the first bad entry:
    a name that is not a farm name, a URL that is not http(s)://host[:port][/path], a name
    given twice."""
    peers: list[PeerConfig] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        name, eq, url = (part.strip() for part in entry.partition("="))
        if not eq:
            raise ValueError(f"{entry!r} is not name=url")
        if not is_farm_name(name):
            raise ValueError(f"peer name {name!r} is not a farm name ({FARM_NAME_RULE})")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"peer {name}'s URL {url!r} is not http(s)://host[:port]")
        try:
            parts.port  # noqa: B018 - urlsplit checks the port only when it is read
        except ValueError:
            raise ValueError(f"peer {name}'s URL {url!r} has a bad port") from None
        if parts.query or parts.fragment:
            raise ValueError(f"peer {name}'s URL {url!r} has a query or fragment")
        if any(p.name == name for p in peers):
            raise ValueError(f"peer {name} is named twice")
        peers.append(PeerConfig(name, url.rstrip("/")))
    return tuple(peers)
