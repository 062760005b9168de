"""The controller without Ryu: what it knows and what it decides, one method per event.

`ControllerCore` holds the fabric as learnt (a FabricView), the plan and the DSCP marks installed
on each connected switch, the marks wanted (REST and jobs), ARP's recent floods, the packets held
behind barriers and the latest statistics. Each event method answers with an `Answer`: the
OpenFlow messages to send, each to its switch, in order, and the packet-outs held until the
barriers among them are answered. The Ryu app (controller/app.py) turns Ryu's events into these
calls and sends the answers; the tests make the same calls and apply the answers to fake switches
(tests/helpers/fakeswitch.py).

Installing thousands of marks takes long, and a REST request may change the wanted marks in the
meantime: `mark_updates` yields one flow-mod at a time, recorded as installed when it is yielded,
starts over from the wanted marks whenever they changed (an epoch counter moved), and stops for
a switch that left or reconnected. The app sends each and lets its other green threads run now
and then (rest.cooperatively).
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from ryu.lib.packet import arp, ethernet, ipv4, packet

from controller import openflow, paths, pipeline, views
from controller.openflow import ETH_ARP, ETH_IP, ETH_LLDP, Message
from controller.priority import FlowClass
from controller.routing import SwitchPlan, plan_fabric
from controller.scheduling import RegisteredJob
from controller.topology import FabricView, Host

LOG = logging.getLogger("fabric")


class ErrorCounter(logging.Handler):
    """Counts ERROR records (Ryu logs handler exceptions and never re-raises them) so the REST
    status and the tests can tell a broken controller from a slow network."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


@dataclass
class Answer:
    """What to send for an event: `messages` in order, each (dpid, message); `held`, when not
    None, the packet-outs waiting for the barrier requests among them (the sender releases
    them with `ControllerCore.release` if a switch never answers)."""
    messages: list[tuple[int, Message]] = field(default_factory=list)
    held: pipeline.Held | None = None


class ControllerCore:
    def __init__(self, lb: str, hosts: Iterable[Host] = ()) -> None:
        self.lb = lb
        self.view = FabricView()
        for host in hosts:  # known in advance: routed as soon as their switch connects
            self.view.pin_host(host)
        # dpid -> number of its connection: a mark installation stops when it changed.
        self.connections: dict[int, int] = {}
        self._numbers = itertools.count()
        self.installed: dict[int, SwitchPlan] = {}
        self.marks: dict[int, dict[tuple, FlowClass]] = {}  # dpid -> match key -> installed mark
        self.wanted = pipeline.WantedMarks()
        self.paths: list[paths.PinnedPath] = []  # the jobs' traffic pinned to chosen paths
        # Bumped whenever the wanted marks may change (a REST change, a host that moved);
        # `converged` has, per switch, the epoch whose marks it holds in full.
        self.marks_epoch = 0
        self.converged: dict[int, int] = {}
        self._wanted_by_switch: tuple[int, dict[int | None, dict[tuple, FlowClass]]] = (-1, {})
        self.arp = pipeline.Arp()
        self.held = pipeline.HeldPackets()
        self.port_stats: dict[int, dict[int, dict]] = {}
        self.group_stats: dict[int, dict[int, list[int]]] = {}
        self.errors = ErrorCounter()

    # -- switch life cycle --------------------------------------------------------------------
    def switch_connected(self, dpid: int) -> Answer:
        """A switch (re)connected: it gets the base pipeline (which wipes what it had) and is
        asked for its ports."""
        self.connections[dpid] = next(self._numbers)
        self.installed[dpid] = SwitchPlan()
        self.marks[dpid] = {}
        self.converged.pop(dpid, None)
        return Answer([(dpid, msg) for msg in pipeline.base_pipeline() + [openflow.port_desc_request()]])

    def port_description(self, dpid: int, name: str | None, ports: dict[int, tuple[str, bool]]) -> Answer:
        """A connected switch's ports, number -> (name, up): it joins the view, the fabric is
        replanned and every live port of it probed."""
        if dpid not in self.connections:
            return Answer()
        name = name or f"{dpid:016x}"
        self.view.add_switch(dpid, name, ports)
        LOG.info("switch %s (%016x) connected with %d ports", name, dpid, len(ports))
        answer = self._replan()
        answer.messages += [(dpid, msg) for msg in pipeline.probes(self.view, dpid)]
        return answer

    def switch_gone(self, dpid: int) -> Answer:
        """The switch's connection closed."""
        if self.connections.pop(dpid, None) is None:
            return Answer()
        LOG.info("switch %016x disconnected", dpid)
        for state in (self.installed, self.marks, self.converged, self.port_stats, self.group_stats):
            state.pop(dpid, None)
        return self._replan() if self.view.remove_switch(dpid) else Answer()

    def port_status(self, dpid: int, port: int, name: str, up: bool, deleted: bool = False) -> Answer:
        """A port was added, changed state or was deleted; a port that came up is probed."""
        if port > openflow.OFPP_MAX or dpid not in self.view.switches:
            return Answer()
        answer = Answer()
        if deleted:
            changed = self.view.delete_port(dpid, port)
        else:
            changed = self.view.set_port(dpid, port, name, up)
            if up:
                answer.messages.append((dpid, pipeline.probe(dpid, port)))
        if changed:
            LOG.info("port %s of %s is %s", port, self.view.switches[dpid].name,
                     "up" if self.view.port_up(dpid, port) else "down")
            answer.messages += self._replan().messages
        return answer

    # -- discovery, ARP and hosts -------------------------------------------------------------
    def probe_all(self) -> Answer:
        """A probe out of every live port of every switch (links come and go without a
        port-status at the far end)."""
        return Answer([(dpid, msg) for dpid in self.connections for msg in pipeline.probes(self.view, dpid)])

    def packet_in(self, dpid: int, in_port: int, data: bytes, now: float) -> Answer:
        """A frame the switch sent up (at time `now`): our probe (a link), ARP (learn the sender,
        deliver or flood), or an IPv4 packet to a host not known yet (learn its sender)."""
        pkt = packet.Packet(data)
        eth = pkt.get_protocol(ethernet.ethernet)
        if eth is None or dpid not in self.view.switches:
            return Answer()
        if eth.ethertype == ETH_LLDP:
            origin = pipeline.probe_origin(data[14:])
            if origin is not None and self.view.add_link(origin, (dpid, in_port)):
                LOG.info("link %016x:%d <-> %016x:%d", *origin, dpid, in_port)
                return self._replan()
        elif eth.ethertype == ETH_ARP and (request := pkt.get_protocol(arp.arp)) is not None:
            decision = self.arp.packet_in(self.view, dpid, in_port, request, data, now)
            if decision is not None:
                changes = self._route_changes() if decision.learnt else pipeline.RouteChanges()
                return self._after_barriers(changes, decision.packet_outs)
        elif eth.ethertype == ETH_IP and (ip := pkt.get_protocol(ipv4.ipv4)) is not None:
            if self.view.learn_host(ip.src, eth.src, dpid, in_port):
                return self._replan()
        return Answer()

    def _after_barriers(self, changes: pipeline.RouteChanges, packet_outs: list[tuple[int, Message]]) -> Answer:
        """The route changes, then `packet_outs` once every switch they change has answered a
        barrier, i.e. applied every flow sent to it before (see pipeline.RouteChanges.barriers)."""
        answer = self._answer(changes)
        awaited = [(dpid, openflow.barrier()) for dpid in sorted(changes.barriers)]
        answer.messages += awaited
        if awaited:
            answer.held = self.held.hold(awaited, packet_outs)
        else:
            answer.messages += packet_outs
        return answer

    def barrier_reply(self, dpid: int, xid: int) -> Answer:
        return Answer(self.held.answered(dpid, xid))

    def release(self, held: pipeline.Held) -> Answer:
        """`held`'s packet-outs, unless the barrier replies released them already."""
        return Answer(self.held.release(held))

    # -- routes and marks ---------------------------------------------------------------------
    def _replan(self) -> Answer:
        """Plan every switch from the view; each connected one gets what changed in its plan."""
        return self._answer(self._route_changes())

    def _route_changes(self) -> pipeline.RouteChanges:
        plans = plan_fabric(self.view, self.lb)
        self.paths = paths.choose_paths(self.view, list(self.wanted.jobs.values()))
        for dpid, pins in paths.pins_by_switch(self.view, self.paths).items():
            plans[dpid].pins = pins
        self.marks_epoch += 1  # a host may have moved to another switch
        changes = pipeline.route_changes({dpid: self.installed[dpid] for dpid in self.connections}, plans)
        self.installed.update(changes.plans)
        return changes

    @staticmethod
    def _answer(changes: pipeline.RouteChanges) -> Answer:
        return Answer([(dpid, msg) for dpid, messages in changes.messages.items() for msg in messages])

    def wanted_by_switch(self) -> dict[int | None, dict[tuple, FlowClass]]:
        """Every wanted mark by the switch it goes on, computed once per epoch."""
        epoch, wanted = self._wanted_by_switch
        if epoch != self.marks_epoch:
            wanted = pipeline.marks_by_switch(self.view, self.wanted.classes())
            self._wanted_by_switch = (self.marks_epoch, wanted)
        return wanted

    def mark_updates(self) -> Iterator[tuple[int, Message]]:
        """The flow-mods, each (dpid, flow-mod), that bring every connected switch's marks to the
        wanted ones: the marks of flows whose source host attaches to it. Each is recorded as
        installed when it is yielded (a caller that waits to send it lets another caller go on
        from there); the marks wanted may change between two of them."""
        for dpid in list(self.connections):
            yield from self._switch_mark_updates(dpid)

    def _switch_mark_updates(self, dpid: int) -> Iterator[tuple[int, Message]]:
        connection = self.connections.get(dpid)
        while connection is not None and self.connections.get(dpid) == connection:
            epoch = self.marks_epoch
            if self.converged.get(dpid) == epoch:
                return
            wanted = self.wanted_by_switch().get(dpid, {})
            have = self.marks[dpid]
            for key in pipeline.mark_changes(have, wanted):
                if self.marks_epoch != epoch or self.connections.get(dpid) != connection:
                    break  # start over from the marks wanted now, or stop
                new = wanted.get(key)
                update = pipeline.mark_update(have.get(key), new)
                if update is None:
                    continue  # another caller got there first
                if new is None:
                    del have[key]
                else:
                    have[key] = new
                yield dpid, update
            else:
                self.converged[dpid] = epoch
                return

    # -- REST operations (the marks follow through mark_updates) ------------------------------
    def set_flow_classes(self, flows: list[FlowClass], replace: bool = False) -> None:
        """Mark flows with a DSCP; a flow with the same match as an earlier one replaces it.
        Raises CapacityError (nothing changed) past MAX_MARKS."""
        self.wanted.set_rest(flows, replace)
        self.marks_epoch += 1

    def remove_flow_classes(self, flows: list[FlowClass] | None = None) -> None:
        """Unmark the given flows (matched by addresses and ports), or all of them."""
        self.wanted.remove_rest(flows)
        self.marks_epoch += 1

    def register_job(self, job: RegisteredJob) -> Answer:
        """Schedule a training job's flows by its policy (a job of the same id is replaced); under a
        sharing policy that chooses paths, the jobs' pins that changed. Raises CapacityError (nothing
        changed) past MAX_JOBS or MAX_MARKS."""
        self.wanted.register(job)
        self.marks_epoch += 1
        return self._replan_paths()

    def remove_job(self, job_id: str) -> Answer | None:
        """Unmark a job's flows and unpin its paths (the other jobs' paths are chosen again): the
        pins that changed; None when no such job is registered."""
        if not self.wanted.remove(job_id):
            return None
        self.marks_epoch += 1
        return self._replan_paths()

    def _replan_paths(self) -> Answer:
        """The route changes a job's arrival or departure makes: only pins move, and only where paths
        were or are chosen (else nothing to plan)."""
        if not self.paths and not paths.chooses_paths(list(self.wanted.jobs.values())):
            return Answer()
        return self._replan()

    # -- statistics ---------------------------------------------------------------------------
    def stats_requests(self) -> Answer:
        return Answer([(dpid, msg) for dpid in self.connections
                       for msg in (openflow.port_stats_request(), openflow.group_stats_request())])

    def port_stats_reply(self, dpid: int, stats: Iterable, now: float) -> list[dict]:
        """A switch's port counters (OFPPortStats) at time `now`: kept as the latest, and
        returned as tidy rows (controller/stats.py)."""
        switch = self.view.switches.get(dpid)
        if switch is None:
            return []
        rows = [{"time_s": round(now, 3), "switch": switch.name, "port": s.port_no,
                 "tx_bytes": s.tx_bytes, "rx_bytes": s.rx_bytes, "tx_packets": s.tx_packets,
                 "rx_packets": s.rx_packets, "tx_dropped": s.tx_dropped, "rx_dropped": s.rx_dropped}
                for s in stats if s.port_no <= openflow.OFPP_MAX]
        self.port_stats.setdefault(dpid, {}).update((row["port"], row) for row in rows)
        return rows

    def group_stats_reply(self, dpid: int, stats: Iterable) -> None:
        """A switch's group counters (OFPGroupStats): the packets of each bucket."""
        if dpid in self.connections:
            self.group_stats[dpid] = {g.group_id: [b.packet_count for b in g.bucket_stats] for g in stats}

    # -- what the REST API shows --------------------------------------------------------------
    def describe(self) -> dict:
        return views.describe(self.view, self.lb, self.errors.count)

    def describe_groups(self) -> dict:
        return views.describe_groups(self.view, self.installed, self.group_stats)

    def describe_flow_classes(self) -> list[dict]:
        return views.describe_flow_classes(self.view, self.wanted.rest)

    def describe_jobs(self, only: str | None = None) -> Iterator[dict]:
        return views.describe_jobs(self.wanted.jobs.values(), self.view, self.paths, only)

    def describe_ports(self) -> list[dict]:
        return views.describe_ports(self.port_stats)
