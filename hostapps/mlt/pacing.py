"""Sending rates: AIMD per peer under its receiver's advice, and the host's own link shared by all.

Pure: the clock is an argument.  A datagram's slot is reserved in virtual time at the rate, and it
may leave when its slot ends; after idling a sender may run PACING_BURST_S ahead.  The transport
sleeps (hostapps.timing.sleep_for) only for waits above PACING_MIN_SLEEP_S: shorter ones are
accumulated, since sleep() is coarse.
"""
import math
from typing import Sequence

from hostapps.transport import Peer

PACING_BURST_S = 0.002         # a sender may run this far ahead of its rate after idling
PACING_MIN_SLEEP_S = 0.001     # shorter delays are accumulated: sleep() is coarse
DECREASE_INTERVAL_S = 0.05     # about an RTT under load: one back-off per congestion episode
LINK_SHARE = 0.995             # of a link, what pacing and advice use: the pacer counts wire bytes, so
                               # this is the real share; the rest carries LLDP, ARP and feedback
FLOOR_SHARE = 1 / 20           # of a link, the least a sender is advised or backs off to


class Pacer:
    """Datagrams spaced at `rate` bytes/s."""

    def __init__(self, bytes_per_s: float):
        self.rate = bytes_per_s
        self._virtual_time = 0.0

    def departure(self, nbytes: int, now: float) -> float:
        """When nbytes reserved now could leave (nothing reserved)."""
        return max(self._virtual_time, now - PACING_BURST_S) + nbytes / self.rate

    def reserve(self, nbytes: int, now: float) -> float:
        """Account nbytes about to be sent; return how long to wait first."""
        self._virtual_time = self.departure(nbytes, now)
        return self._virtual_time - now


class RateControl(Pacer):
    """Paced sending rate towards one peer: AIMD on the loss each message's first feedback reports."""

    def __init__(self, link_bytes_per_s: float):
        super().__init__(link_bytes_per_s)
        self.ceiling = link_bytes_per_s
        self.floor = link_bytes_per_s * FLOOR_SHARE
        self.increase = link_bytes_per_s / 32
        self.advised = link_bytes_per_s  # the receiver's latest fair-share advice
        self._last_decrease = -math.inf

    def on_feedback(self, lost_fraction: float, now: float) -> None:
        """Additive increase per loss-free message; at most one multiplicative decrease per
        DECREASE_INTERVAL_S, since the messages of one burst all report the same congestion."""
        if lost_fraction <= 0:
            self.rate = min(self.ceiling, self.advised, self.rate + self.increase)
        elif now - self._last_decrease >= DECREASE_INTERVAL_S:
            self.rate = max(self.floor, self.rate * (1 - min(1.0, lost_fraction) / 2))
            self._last_decrease = now

    def advise(self, bytes_per_s: float) -> None:
        """The receiver's fair share for us caps the rate; when the share grows (a sender left), the
        rate grows by as much, keeping any back-off from loss elsewhere on the path."""
        advised = min(self.ceiling, max(self.floor, bytes_per_s))
        self.rate = min(advised, self.rate + max(0.0, advised - self.advised))
        self.advised = advised


class HostPacer:
    """Every peer's RateControl, and this host's link which they all share: a PS answering n workers
    must not send n links' worth.  The link is paced just under its rate (LINK_SHARE), or its own
    queue grows with every pacing hiccup until it drops."""

    def __init__(self, link_bytes_per_s: float):
        self.link_bytes_per_s = link_bytes_per_s
        self.link = Pacer(LINK_SHARE * link_bytes_per_s)
        self.rates: dict[Peer, RateControl] = {}

    def add(self, peer: Peer) -> None:
        self.rates[peer] = RateControl(self.link_bytes_per_s)

    def reserve(self, peer: Peer, nbytes: int, now: float) -> float:
        """Reserve a slot for nbytes to `peer` at its rate and on the link; return when they may leave."""
        return now + max(self.rates[peer].reserve(nbytes, now), self.link.reserve(nbytes, now))

    def schedule(self, heads: Sequence[tuple[Peer, int]], now: float) -> tuple[Peer, float]:
        """Of the peers with a datagram of nbytes waiting, the one whose rate lets it leave first (a
        slow peer does not hold up a fast one); reserve its slot, and return it with the time its
        datagram may leave."""
        if len(heads) == 1:
            (peer, nbytes), = heads
        else:
            peer, nbytes = min(heads, key=lambda head: self.rates[head[0]].departure(head[1], now))
        return peer, self.reserve(peer, nbytes, now)
