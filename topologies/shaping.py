"""Egress shaping of one port: an HTB tree with 8 strict-priority classes keyed on the DSCP
class selector (the top 3 bits of the TOS byte), CS7 highest, CS0/unmarked lowest.

Why these numbers (measured on a 2-core VM, see PLATFORM.md "Fabric capacity"): with tc's
default bursts (cburst ~ one MTU) a class at its ceiling sends about one packet per qdisc
watchdog tick and the fabric carries a third of its rate; 64 KB bursts lift HTB to TBF's level.
Each class has a token rate of only 1% of the link so that, once the link is full, the classes
share it by HTB's `prio` alone, i.e. strict priority.
"""
from __future__ import annotations

NUM_CLASSES = 8
BURST = "64k"
# Non-IP frames (ARP, LLDP probes) are network control: the top class, so load never starves them.
DEFAULT_CLASS = NUM_CLASSES - 1


def class_id(cs: int) -> str:
    """HTB class id of DSCP class selector `cs` (0..7)."""
    return f"1:{0x10 + cs:x}"


def htb_priority_tree(dev: str, rate_mbit: float, queue_bytes: int) -> list[str]:
    """`tc -batch` lines that replace `dev`'s root qdisc with the 8-class priority tree.

    rate_mbit: the link rate; queue_bytes: the byte limit of each class's FIFO.
    """
    if not rate_mbit > 0:  # also refuses NaN
        raise ValueError(f"rate_mbit: {rate_mbit} is not allowed (a rate > 0 in Mbit/s)")
    if queue_bytes < 1514:
        raise ValueError(f"queue_bytes: {queue_bytes} is not allowed (at least one MTU, 1514)")
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
            f"burst {BURST} cburst {BURST} prio {NUM_CLASSES - 1 - cs} quantum 1514",
            f"qdisc replace dev {dev} parent {cid} handle {handle} bfifo limit {queue_bytes}",
            f"filter replace dev {dev} parent 1: protocol ip prio 1 handle 800::{0x800 + cs:x} "
            f"u32 match ip tos {cs << 5:#04x} 0xe0 flowid {cid}",
        ]
    return lines


def offloads_off(dev: str) -> str:
    """Userspace OVS stalls TCP unless segmentation/checksum offloads are off on every veth."""
    return f"ethtool -K {dev} tx off tso off gso off gro off"
