"""The fabric's frames: the MTU every link of a fabric is set to, and what a frame carries
besides its IP packet. The topologies size queues and quanta in frames of it, mlt sizes its
datagrams to it, and the bounds count its framing."""
MIN_MTU, MAX_MTU = 1280, 9000  # IPv6's minimum link MTU; the jumbo frames of datacenter fabrics
# Jumbo frames: a sixth of the packets per byte, so the one forwarding thread of OVS keeps up with
# the links (docs/platform.md, "Open vSwitch").
DEFAULT_MTU = 9000
ETHERNET_HEADER_BYTES = 14  # what HTB counts besides the IP packet (no FCS, no preamble)
MTU_ALLOWED = f"an integer {MIN_MTU}..{MAX_MTU} bytes"


def is_mtu(mtu: object) -> bool:
    return not isinstance(mtu, bool) and isinstance(mtu, int) and MIN_MTU <= mtu <= MAX_MTU


def check_mtu(mtu: object) -> int:
    if not is_mtu(mtu):
        raise ValueError(f"mtu: {mtu!r} is not allowed ({MTU_ALLOWED})")
    return mtu  # type: ignore[return-value]


def frame_bytes(mtu: int) -> int:
    """The largest frame a link of this MTU carries, as HTB counts it."""
    return mtu + ETHERNET_HEADER_BYTES
