"""Who owns what our node classes create in machine-wide places: the value of our mark
(common/owner.py OWNER_KEY) as an OVS external id on bridges and ports, and in the alias of every
interface of our links (`dnn-testbed <owner>`).

- `fabric-<id>`: a fabric of the testbed (emulation/fabric.py), whose state file records that id;
  clean-up removes what it left once it no longer runs.
- `hand-run`: a network `mn --custom topologies/leafspine.py` built with our Topo; it holds no lock
  and records nothing, so clean-up leaves it alone unless asked for it by name.
A mark without an owner (`1`, or the bare alias) is of a testbed that predates owners: nobody's
record, so it is treated like a hand-run one.

Only the standard library: `mn` imports this under /usr/bin/python3.
"""
from __future__ import annotations

import re

from common.owner import OWNER_KEY

HAND_RUN = "hand-run"
UNKNOWN = "unknown"
_FABRIC = re.compile(r"fabric-[0-9a-z]+")


def fabric_owner(fabric_id: str) -> str:
    """The mark of what the fabric with this id creates."""
    owner = f"fabric-{fabric_id}"
    if not _FABRIC.fullmatch(owner):
        raise ValueError(f"fabric id: {fabric_id!r} is not allowed (lower-case letters and digits)")
    return owner


def is_fabric(owner: str) -> bool:
    return bool(_FABRIC.fullmatch(owner))


def owner_of_external_id(value: str) -> str:
    """The owner an OVS external id OWNER_KEY=value names."""
    return value if is_fabric(value) or value == HAND_RUN else UNKNOWN


def interface_alias(owner: str) -> str:
    return f"{OWNER_KEY} {owner}"


def owner_of_alias(alias: str | None) -> str | None:
    """The owner an interface alias names; None when it is not our mark at all."""
    if alias == OWNER_KEY:
        return UNKNOWN
    if alias and alias.startswith(OWNER_KEY + " "):
        return owner_of_external_id(alias[len(OWNER_KEY) + 1:])
    return None
