"""Who this process talks to over mlt, which datagrams count as theirs, and how far each connection is.

Plain data and one rule, no sockets: the transport guards the life cycle sets with its lock.
"""
from hostapps import codec
from hostapps.transport import Address, Peer


class Peers:
    """Each peer's name, address and host, and its connection's life cycle: HELLO heard, BYE heard, gone."""

    def __init__(self, tag: int):
        self.tag = tag  # the job's: in every frame of it
        self.names: dict[Peer, str] = {}
        self.addresses: dict[Peer, Address] = {}
        self.hosts: dict[Peer, str] = {}  # each peer's IPv4 address: its datagrams must come from there
        self.heard: set[Peer] = set()
        self.byes: set[Peer] = set()
        self.gone: dict[Peer, str] = {}   # failed, with the reason

    def sender_of(self, frame: codec.Frame, host: str) -> Peer | None:
        """The peer a datagram from `host` counts for, or None: not our job's (another tag), or not from the host
        of the peer its header names.  Any source port of that host: its data leaves from sport_range ephemeral
        ports per DSCP class in use.  Binding those pools to port ranges known in advance would need a range reserved
        per process, and on loopback (tests, bench), where every process shares one address, such ranges
        could take the ports handed out to the peers.  Every other host is kept out here; other runs'
        processes on a peer's host (the runner reuses hosts and ports) by the tag, unique per run."""
        peer = Peer(frame.role, frame.rank)
        if frame.tag != self.tag or self.hosts.get(peer) != host:
            return None
        return peer
