"""Congestion-aware spraying: the source ports (paths) to a peer whose datagrams queued, and those
that went through.

A fabric that sprays hashes each datagram's 5-tuple onto a spine, blind to the queues there (OVS select
groups); MLT's switches pick the shorter queue per packet instead.  The hosts get that effect here, as
REPS (Ultra Ethernet) recycles the entropies whose packets went through uncongested.  Every data
datagram carries its send time (the sender's clock; only differences of one sender's stamps count, so no
clock is shared): one that arrives after a datagram of its class its sender sent more than QUEUE_FRAMES
frame times later (at the receiving link's rate) was overtaken, so it queued that much longer on its way
and crossed a congested path; the others went through.  The receiver names both kinds of source port to
the sender (a PATHS frame, at most every REPORT_INTERVAL_S), the clear ones only during a congestion
episode (EPISODE_STRIKES congested datagrams, each within STRIKE_GAP_S of the last and over
EPISODE_SPAN_S in all, begin one; ADAPT_S without one ends it): without congestion it names nothing, and
after a stray one only that port.  The sender avoids a congested port for about AVOID_S, and while it
hears of clear ports (ADAPT_S since the last) it sends each datagram from a random one of the ports that
went through since (until one is reported congested), or from a random port not avoided while it knows
none.  It sends none at random during an episode to explore: one datagram in a 40 ms queue delays its
whole message.  Otherwise it sprays at random over every port, the most even spread a hash allows.

Delay, not loss: a queue full of bulk TCP delays a datagram long before it drops one.  Overtaking, not
delay: what every path shares (the sender's and the receiver's link, a switch thread that stalls, the
receiving thread's wait for the GIL) delays datagrams in the order they were sent, and flags nothing;
neither does a single path (ECMP).  Plain data; the clock is an argument.
"""
import random
from typing import NamedTuple

from hostapps.transport import Peer

QUEUE_FRAMES = 3            # of the receiving link's full frames: overtaken by more than that marks a path
MIN_QUEUE_DELAY_S = 0.005   # ... and at least this: switch threads reorder paths by a few ms unloaded
STAMP_RANGE = 1 << 32       # send stamps are microseconds modulo this (71 minutes)
HALF_STAMP = STAMP_RANGE // 2
REPORT_INTERVAL_S = 0.01    # a sender hears of its ports at most this often
MAX_PORTS_PER_REPORT = 512  # 1 KB of payload: one datagram at any MTU
AVOID_S = 0.5               # a congested port is avoided for 0.5-1.5 x this (spread: they come back one by one)
ADAPT_S = 3.0               # a congestion episode lasts this long from its last congested datagram (beyond an
#                             iteration: a PS sends a worker one pull an iteration)
EPISODE_STRIKES = 10        # congested datagrams, each within STRIKE_GAP_S of the last, begin an episode:
STRIKE_GAP_S = 0.05         # a queue flags half a message's datagrams at once, a passing transient a few;
EPISODE_SPAN_S = 0.02       # ... arriving over this at least: a host's backlog let go after a CPU stall arrives at
#                             once (about ten flagged within 12 ms on an unloaded fabric), a queue's over tens of ms
MAX_AVOIDED_SHARE = 7 / 8   # of the ports: when (nearly) every path queues, there is nothing to choose
PICK_TRIES = 8              # random draws for a port not avoided, then any
MAX_CLEAR_PORTS = 1024      # ports that went through, kept per peer to send from


class PathReport(NamedTuple):
    """A sender's source ports heard since the last report."""
    congested: list[int]
    clear: list[int]


class PathMonitor:
    """Receiver side: each sender's source ports whose datagrams queued or went through, until reported."""

    def __init__(self, frame_bytes: int, link_mbps: float):
        """frame_bytes: a full data datagram on the wire; link_mbps: the receiving host's link."""
        self.queue_delay_us = 1e6 * max(MIN_QUEUE_DELAY_S, QUEUE_FRAMES * frame_bytes * 8 / (link_mbps * 1e6))
        self._latest_sent: dict[tuple[Peer, int], int] = {}  # per sender and DSCP: the latest send stamp so far
        self._congested: dict[Peer, set[int]] = {}
        self._clear: dict[Peer, set[int]] = {}
        self._episode_until: dict[Peer, float] = {}  # per sender: its clear ports are worth reporting until then
        self._strikes: dict[Peer, tuple[int, float, float]] = {}  # per sender: congested datagrams, each
        #                                          within STRIKE_GAP_S of the last, the first's time and the last's
        self._next_report = 0.0
        self.flagged = 0  # datagrams that queued: a counter for the run's summary

    def observe(self, peer: Peer, port: int, sent_us: int, now: float, dscp: int = 0) -> None:
        """One data datagram from `peer`'s source `port`, stamped `sent_us` (microseconds modulo 2^32),
        arrived at `now`.  Only datagrams of one DSCP are compared: strict priority lets another class
        overtake them on any path."""
        queue = (peer, dscp)
        latest = self._latest_sent.get(queue, sent_us)
        ahead = (latest - sent_us + HALF_STAMP) % STAMP_RANGE - HALF_STAMP  # of this one, the latest sent before
        if ahead > self.queue_delay_us:
            self._congested.setdefault(peer, set()).add(port)
            self.flagged += 1
            count, first, last = self._strikes.get(peer, (0, now, now))
            if now - last > STRIKE_GAP_S:
                count, first = 0, now
            self._strikes[peer] = (count + 1, first, now)
            if count + 1 >= EPISODE_STRIKES and now - first >= EPISODE_SPAN_S:
                self._episode_until[peer] = now + ADAPT_S
        elif self._episode_until.get(peer, 0.0) > now:  # the sender sends from clear ports only meanwhile
            self._clear.setdefault(peer, set()).add(port)
        if ahead <= 0:
            self._latest_sent[queue] = sent_us

    def report(self, now: float) -> dict[Peer, PathReport]:
        """The ports heard since the last report, per sender (nothing before REPORT_INTERVAL_S); a port heard
        both ways counts as congested."""
        if now < self._next_report or not (self._congested or self._clear):
            return {}
        self._next_report = now + REPORT_INTERVAL_S
        reports = {}
        for peer in self._congested.keys() | self._clear.keys():
            congested = self._congested.get(peer, set())
            congested_list = sorted(congested)[:MAX_PORTS_PER_REPORT]
            clear = sorted(self._clear.get(peer, set()) - congested)[:MAX_PORTS_PER_REPORT - len(congested_list)]
            reports[peer] = PathReport(congested_list, clear)
        self._congested, self._clear = {}, {}
        return reports


class PathChooser:
    """Sender side: which source port each datagram to a peer leaves from.  `hear` runs in the receive loop
    and `pick` in the sending threads: a peer's avoided and clear ports are replaced as a whole, never changed
    in place, so a pick reads consistent ones without a lock."""

    def __init__(self, ports: list[int], rng: random.Random | None = None):
        self.ports = ports
        self._index = {port: index for index, port in enumerate(ports)}
        self._rng = rng or random.Random()
        self._avoided: dict[Peer, dict[int, float]] = {}  # per peer: port -> avoided until
        self._clear: dict[Peer, dict[int, None]] = {}     # per peer: indices of ports that went through lately
        self._clear_now: dict[Peer, tuple[int, ...]] = {}  # ... the same, as picks read them
        self._adapt_until: dict[Peer, float] = {}         # per peer: send from clear ports until then (an episode)

    def hear(self, peer: Peer, report: PathReport, now: float) -> int:
        """A peer's report; return how many ports towards it are avoided now."""
        avoided = self._avoided.get(peer, {})
        if report.clear:  # the receiver names clear ports only during a congestion episode
            if self._adapt_until.get(peer, 0.0) <= now:  # a new episode: what went through before may not now
                self._clear[peer], self._clear_now[peer] = {}, ()
            self._adapt_until[peer] = now + ADAPT_S
        if report.congested:
            avoided = {port: until for port, until in avoided.items() if until > now}
            room = int(MAX_AVOIDED_SHARE * len(self.ports)) - len(avoided)
            for port in report.congested:
                if room <= 0:
                    break
                if port not in avoided:
                    room -= 1
                avoided[port] = now + AVOID_S * self._rng.uniform(0.5, 1.5)
            self._avoided[peer] = avoided
        clear = self._clear.setdefault(peer, {})
        before = len(clear)
        for port in report.congested:
            clear.pop(self._index.get(port), None)
        removed = before - len(clear)
        clear.update((index, None) for port in report.clear
                     if (index := self._index.get(port)) is not None and port not in avoided)
        if removed or len(clear) != before:  # rebuilt only when changed: most reports name known ports
            while len(clear) > MAX_CLEAR_PORTS:
                del clear[next(iter(clear))]
            self._clear_now[peer] = tuple(clear)
        return len(avoided)

    def pick(self, peer: Peer, now: float) -> int:
        """The index in `ports` of the source port for a datagram to `peer`."""
        avoided = self._avoided.get(peer) or {}
        if self._adapt_until.get(peer, 0.0) > now and (clear := self._clear_now.get(peer)):
            index = clear[self._rng.randrange(len(clear))]
            if avoided.get(self.ports[index], 0.0) <= now:
                return index
        index = self._rng.randrange(len(self.ports))
        if avoided:
            for _ in range(PICK_TRIES - 1):
                if avoided.get(self.ports[index], 0.0) <= now:
                    break
                index = self._rng.randrange(len(self.ports))
        return index
