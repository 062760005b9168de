"""Egress shaping of one port: an HTB tree with 8 strict-priority classes keyed on the DSCP
class selector (the top 3 bits of the TOS byte), served CS7, CS6, ..., CS2, CS0 (unmarked), and
CS1 last: CS1 is the droppable (scavenger, RFC 3662/8622 lower-effort) class, with a short FIFO,
so under congestion its datagrams wait behind everything and are the first dropped.

Why these numbers (measured on a 2-core VM, see PLATFORM.md "Fabric capacity"): with tc's
default bursts (cburst ~ one MTU) a class at its ceiling sends about one packet per qdisc
watchdog tick and the fabric carries a third of its rate; 64 KB bursts lift HTB to TBF's level.
Each class has a token rate of only 1% of the link so that, once the link is full, the classes
share it by HTB's `prio` alone, i.e. strict priority.
"""
from __future__ import annotations

from typing import Mapping

NUM_CLASSES = 8
BURST = "64k"
DROPPABLE_CLASS = 1
DROPPABLE_QUEUE_BYTES = 16 * 1024
# Class selectors in the order they are served (HTB prio 0 first).
SERVICE_ORDER = (7, 6, 5, 4, 3, 2, 0, DROPPABLE_CLASS)
MTU_BYTES = 1514
# Non-IP frames (ARP, LLDP probes) are network control: the top class, so load never starves them.
DEFAULT_CLASS = NUM_CLASSES - 1


def class_id(cs: int) -> str:
    """HTB class id of DSCP class selector `cs` (0..7)."""
    return f"1:{0x10 + cs:x}"


def class_queue_limits(queue_bytes: int, class_queue_bytes: Mapping[int, int] | None = None
                       ) -> list[int]:
    """The FIFO byte limit of each class selector 0..7: `queue_bytes`, except the droppable class
    (DROPPABLE_QUEUE_BYTES, or `queue_bytes` when smaller) and what `class_queue_bytes` sets."""
    if queue_bytes < MTU_BYTES:
        raise ValueError(f"queue_bytes: {queue_bytes} is not allowed (at least one MTU, 1514)")
    limits = {cs: queue_bytes for cs in range(NUM_CLASSES)}
    limits[DROPPABLE_CLASS] = min(queue_bytes, DROPPABLE_QUEUE_BYTES)
    for cs, limit in (class_queue_bytes or {}).items():
        if cs not in limits:
            raise ValueError(f"class_queue_bytes: class {cs!r} is not allowed (0..7)")
        if limit < MTU_BYTES:
            raise ValueError(f"class_queue_bytes[{cs}]: {limit} is not allowed "
                             "(at least one MTU, 1514)")
        limits[cs] = limit
    return [limits[cs] for cs in range(NUM_CLASSES)]


def htb_priority_tree(dev: str, rate_mbit: float, queue_bytes: int,
                      class_queue_bytes: Mapping[int, int] | None = None) -> list[str]:
    """`tc -batch` lines that replace `dev`'s root qdisc with the 8-class priority tree.

    rate_mbit: the link rate; queue_bytes: the byte limit of each class's FIFO;
    class_queue_bytes: per-class-selector limits replacing it (see `class_queue_limits`).
    """
    if not rate_mbit > 0:  # also refuses NaN
        raise ValueError(f"rate_mbit: {rate_mbit} is not allowed (a rate > 0 in Mbit/s)")
    limits = class_queue_limits(queue_bytes, class_queue_bytes)
    rate = f"{rate_mbit:g}mbit"
    floor = f"{max(rate_mbit * 10, 8):g}kbit"  # 1% of the link, tc's minimum being 8 kbit
    lines = [
        f"qdisc replace dev {dev} root handle 1: htb default {0x10 + DEFAULT_CLASS:x}",
        f"class replace dev {dev} parent 1: classid 1:1 htb rate {rate} ceil {rate} "
        f"burst {BURST} cburst {BURST} quantum 1514",
    ]
    for cs in range(NUM_CLASSES):
        cid = class_id(cs)
        handle = f"{0x10 + cs:x}:"
        lines += [
            f"class replace dev {dev} parent 1:1 classid {cid} htb rate {floor} ceil {rate} "
            f"burst {BURST} cburst {BURST} prio {SERVICE_ORDER.index(cs)} quantum 1514",
            f"qdisc replace dev {dev} parent {cid} handle {handle} bfifo limit {limits[cs]}",
            f"filter replace dev {dev} parent 1: protocol ip prio 1 handle 800::{0x800 + cs:x} "
            f"u32 match ip tos {cs << 5:#04x} 0xe0 flowid {cid}",
        ]
    return lines


def offloads_off(dev: str) -> str:
    """Userspace OVS stalls TCP unless segmentation/checksum offloads are off on every veth."""
    return f"ethtool -K {dev} tx off tso off gso off gro off"
