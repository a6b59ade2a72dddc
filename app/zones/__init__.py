"""Zones: farms that know their peers and send them the work they cannot take.

`ids` names farms and the ids that carry a farm's name (imported by the settings, so it
imports nothing of the farm); `peers` is the set of peers and their readiness (`PeerSet`, one
probing thread per process); `forward` sends a request to a peer and streams its answer back.
Nothing is imported here, so the settings can read `ids` without pulling in HTTP clients.
"""
