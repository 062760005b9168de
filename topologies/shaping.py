"""Egress shaping of one port: an HTB tree with 8 strict-priority classes keyed on the DSCP
class selector (the top 3 bits of the TOS byte), served in the order of the class plan
(common/classes.py): CS7, CS6, ..., CS2, CS0 (unmarked), and CS1 last, the droppable class, with
a short queue, so under congestion its datagrams wait behind everything and are dropped first.

Why these choices (measured on a 2-core VM; docs/platform.md "Queues and rates"):
- Bursts: with tc's default bursts (cburst ~ one MTU) a class at its ceiling sends about one packet
  per qdisc watchdog tick and the fabric carries a third of its rate; 64 KB bursts lift HTB to
  TBF's level.
- Each class has a token rate of only 1% of the link so that, once the link is full, the classes
  share it by HTB's `prio` alone, i.e. strict priority.
- Class queues are `pfifo_head_drop`: a full queue drops its own oldest packet and accepts the new
  one. A full `bfifo` refuses the enqueue (ENOBUFS), and userspace OVS then drops the rest of its
  transmit batch, higher classes included: a class-blind drop outside the queues.
- Queues count packets, so they are sized in frames of the link's MTU.
"""
from __future__ import annotations

from common.classes import DROPPABLE_CLASS, NETWORK_CONTROL_CLASS, NUM_CLASSES, SERVICE_ORDER
from common.frames import check_mtu, frame_bytes

BURST = "64k"
DROPPABLE_QUEUE_PACKETS = 10  # about 16 KB at MTU 1500: under congestion it is soon full
MIN_QUEUE_PACKETS = 4
# Non-IP frames (ARP, LLDP probes) are network control: the top class, so load never starves them.
DEFAULT_CLASS = NETWORK_CONTROL_CLASS


def class_id(cs: int) -> str:
    """HTB class id of DSCP class selector `cs` (0..7)."""
    return f"1:{0x10 + cs:x}"


def leaf_handle(cs: int) -> str:
    """Handle of the queue (leaf qdisc) of class selector `cs`, e.g. '15:' for CS5."""
    return f"{0x10 + cs:x}:"


def class_queue_packets(queue_bytes: int, mtu: int) -> list[int]:
    """The packet limit of each class selector's queue 0..7: `queue_bytes` worth of full frames
    (at least MIN_QUEUE_PACKETS), the droppable class DROPPABLE_QUEUE_PACKETS (or fewer)."""
    check_mtu(mtu)
    if queue_bytes < frame_bytes(mtu):
        raise ValueError(f"queue_bytes: {queue_bytes} is not allowed (at least one frame, "
                         f"{frame_bytes(mtu)} bytes at MTU {mtu})")
    packets = max(MIN_QUEUE_PACKETS, queue_bytes // frame_bytes(mtu))
    limits = [packets] * NUM_CLASSES
    limits[DROPPABLE_CLASS] = min(packets, DROPPABLE_QUEUE_PACKETS)
    return limits


def htb_classes(dev: str, rate_mbit: float, mtu: int) -> list[str]:
    """`tc` lines (re)setting the root class and the 8 priority classes of `dev` at a rate."""
    if not rate_mbit > 0:  # also refuses NaN
        raise ValueError(f"rate_mbit: {rate_mbit} is not allowed (a rate > 0 in Mbit/s)")
    rate = f"{rate_mbit:g}mbit"
    floor = f"{max(rate_mbit * 10, 8):g}kbit"  # 1% of the link, tc's minimum being 8 kbit
    quantum = frame_bytes(check_mtu(mtu))
    lines = [f"class replace dev {dev} parent 1: classid 1:1 htb rate {rate} ceil {rate} "
             f"burst {BURST} cburst {BURST} quantum {quantum}"]
    for cs in range(NUM_CLASSES):
        lines.append(f"class replace dev {dev} parent 1:1 classid {class_id(cs)} htb rate {floor} "
                     f"ceil {rate} burst {BURST} cburst {BURST} prio {SERVICE_ORDER.index(cs)} "
                     f"quantum {quantum}")
    return lines


def htb_priority_tree(dev: str, rate_mbit: float, queue_bytes: int, mtu: int) -> list[str]:
    """`tc -batch` lines that replace `dev`'s root qdisc with the 8-class priority tree.

    rate_mbit: the link rate; queue_bytes: the bytes each class queues (in full frames of `mtu`).
    """
    classes = htb_classes(dev, rate_mbit, mtu)
    limits = class_queue_packets(queue_bytes, mtu)
    lines = [f"qdisc replace dev {dev} root handle 1: htb default {0x10 + DEFAULT_CLASS:x}",
             classes[0]]
    for cs in range(NUM_CLASSES):
        lines += [
            classes[1 + cs],
            f"qdisc replace dev {dev} parent {class_id(cs)} handle {leaf_handle(cs)} "
            f"pfifo_head_drop limit {limits[cs]}",
            f"filter replace dev {dev} parent 1: protocol ip prio 1 handle 800::{0x800 + cs:x} "
            f"u32 match ip tos {cs << 5:#04x} 0xe0 flowid {class_id(cs)}",
        ]
    return lines


def offloads_off(dev: str) -> str:
    """Userspace OVS stalls TCP unless segmentation/checksum offloads are off on every veth."""
    return f"ethtool -K {dev} tx off tso off gso off gro off"
