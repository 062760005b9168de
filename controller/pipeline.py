"""What the controller sends, decided from plain data: the FabricView, the routing plans, the
flow classes wanted, a clock. Every decision returns OpenFlow messages (controller/openflow.py)
and the app only sends them, so all of it runs in tests against fake switches.

Tables: 0 classifies (per-flow DSCP marks at the flow's ingress switch, from REST and from
registered training jobs, then goto 1); 1 forwards (host routes, above them a job's traffic between
two of its hosts pinned to its chosen path, probes and ARP to the controller, unknown IPv4 to the
controller to learn its sender, everything else dropped).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Mapping

from ryu.lib.packet import arp

from controller import openflow
from controller.openflow import ETH_ARP, ETH_IP, ETH_LLDP, Match, Message
from controller.priority import MAX_MARKS, PROTOCOLS, CapacityError, FlowClass, ingress_switch
from controller.routing import Output, SwitchPlan
from controller.scheduling import RegisteredJob, job_flow_classes, sharing_of
from controller.sharing import MAX_JOBS
from controller.topology import FabricView

CLASSIFY_TABLE, FORWARD_TABLE = 0, 1
PRIO_PROBE, PRIO_ROUTE, PRIO_ARP, PRIO_IP_MISS = 1000, 500, 10, 5
PRIO_PIN = 600  # a host pair's traffic on its chosen path wins over the destination's route
# A mark that matches an incoming DSCP (LE -> droppable) wins over the per-flow marks.
PRIO_MARK, PRIO_MARK_BY_DSCP = 800, 900
PROBE_DST_BYTES = bytes.fromhex("0180c200000e")  # LLDP nearest-bridge address
PROBE_SRC_BYTES = bytes.fromhex("020000000001")
PROBE_MAGIC = b"DNNTB-PROBE"
# An ARP request we flood may come back to us through the fabric; ignore such echoes this long.
FLOOD_ECHO_S = 0.5


# -- a switch connects ----------------------------------------------------------------------------
def base_pipeline() -> list[Message]:
    """Wipe what the switch had (it may be a new fabric) and install the tables' fixed flows."""
    return [
        openflow.flows_delete_all(),
        openflow.groups_delete_all(),
        openflow.flow_add(CLASSIFY_TABLE, 0, openflow.match(), goto=FORWARD_TABLE),
        openflow.flow_add(FORWARD_TABLE, PRIO_PROBE, openflow.match(eth_type=ETH_LLDP),
                          [openflow.to_controller()]),
        # All ARP goes through the controller: it learns both ends and delivers to the target.
        openflow.flow_add(FORWARD_TABLE, PRIO_ARP, openflow.match(eth_type=ETH_ARP),
                          [openflow.to_controller()]),
        # Unknown IPv4 destinations: to the controller only to learn the sender, then dropped.
        openflow.flow_add(FORWARD_TABLE, PRIO_IP_MISS, openflow.match(eth_type=ETH_IP),
                          [openflow.to_controller(128)]),
    ]


# -- discovery ------------------------------------------------------------------------------------
def probe(dpid: int, port: int) -> Message:
    """A discovery frame naming its origin (dpid, port); built by hand because Ryu's
    serializer pads a bare Ethernet header to 60 bytes before our payload."""
    header = PROBE_DST_BYTES + PROBE_SRC_BYTES + struct.pack("!H", ETH_LLDP)
    return openflow.packet_out(port, header + PROBE_MAGIC + struct.pack("!QI", dpid, port))


def probes(view: FabricView, dpid: int) -> list[Message]:
    """A probe out of every live port of the switch."""
    switch = view.switches.get(dpid)
    return [probe(dpid, port) for port in sorted(switch.live_ports())] if switch else []


def probe_origin(payload: bytes) -> tuple[int, int] | None:
    """The (dpid, port) a probe was sent from, given the frame after its Ethernet header;
    None for an LLDP frame that is not our probe."""
    if not payload.startswith(PROBE_MAGIC) or len(payload) < len(PROBE_MAGIC) + 12:
        return None
    return struct.unpack_from("!QI", payload, len(PROBE_MAGIC))


# -- routes and groups ----------------------------------------------------------------------------
def route_match(ip: str) -> Match:
    return openflow.match(eth_type=ETH_IP, ipv4_dst=ip)


def pin_match(pair: tuple[str, str]) -> Match:
    return openflow.match(eth_type=ETH_IP, ipv4_src=pair[0], ipv4_dst=pair[1])


def output_actions(out: Output) -> list:
    return [openflow.to_group(out.group_id) if out.group_id is not None
            else openflow.output(out.port)]


def plan_changes(old: SwitchPlan, new: SwitchPlan) -> list[Message]:
    """What brings a switch from plan `old` to `new`: new and changed groups first (a route may
    use them), then routes, then pins, then groups no longer used, behind a barrier so that no flow
    still points at a group when it goes. Empty when nothing changed."""
    messages = [openflow.select_group(g.group_id, g.ports, g.selection_method)
                for gid, g in new.groups.items() if old.groups.get(gid) != g]
    messages += [openflow.flow_add(FORWARD_TABLE, PRIO_ROUTE, route_match(ip), output_actions(out))
                 for ip, out in new.routes.items() if old.routes.get(ip) != out]
    messages += [openflow.flow_delete_strict(FORWARD_TABLE, PRIO_ROUTE, route_match(ip))
                 for ip in old.routes.keys() - new.routes.keys()]
    messages += [openflow.flow_add(FORWARD_TABLE, PRIO_PIN, pin_match(pair), output_actions(out))
                 for pair, out in sorted(new.pins.items()) if old.pins.get(pair) != out]
    messages += [openflow.flow_delete_strict(FORWARD_TABLE, PRIO_PIN, pin_match(pair))
                 for pair in sorted(old.pins.keys() - new.pins.keys())]
    if gone := old.groups.keys() - new.groups.keys():
        messages.append(openflow.barrier())
        messages += [openflow.group_delete(gid) for gid in gone]
    return messages


@dataclass(frozen=True)
class RouteChanges:
    """The messages that bring each switch whose routes or groups changed to its new plan."""
    plans: dict[int, SwitchPlan] = field(default_factory=dict)
    messages: dict[int, list[Message]] = field(default_factory=dict)

    @property
    def barriers(self) -> set[int]:
        """The switches a packet released after this change must wait for (barrier replies):
        an ARP reply released at once let the first ping overtake its route on another switch's
        connection, and 1 in 30 first pings was lost."""
        return set(self.messages)


def route_changes(installed: Mapping[int, SwitchPlan],
                  plans: Mapping[int, SwitchPlan]) -> RouteChanges:
    """For every switch of `installed` (what each connected switch has), what brings it to its
    plan in `plans` (a switch without one gets an empty plan)."""
    changes = RouteChanges()
    for dpid, old in installed.items():
        new = plans.get(dpid, SwitchPlan())
        if messages := plan_changes(old, new):
            changes.plans[dpid], changes.messages[dpid] = new, messages
    return changes


# -- DSCP marks -----------------------------------------------------------------------------------
class WantedMarks:
    """The flow classes wanted: those set over REST and every registered training job's. Each
    change is checked against the limits first and refused whole (CapacityError)."""

    def __init__(self) -> None:
        self.rest: list[FlowClass] = []  # set over REST (/fabric/classes)
        self.jobs: dict[str, RegisteredJob] = {}
        self.job_classes: dict[str, list[FlowClass]] = {}  # job id -> its rewrites
        self.job_bands: dict[str, tuple[int, ...]] = {}  # job id -> the classes its rewrites use

    def classes(self) -> list[FlowClass]:
        """The REST marks, then every job's (a later class for one match replaces an earlier)."""
        merged = {f.match_key(): f for f in self.rest}
        merged.update((f.match_key(), f) for classes in self.job_classes.values() for f in classes)
        return list(merged.values())

    def set_rest(self, flows: list[FlowClass], replace: bool = False) -> None:
        """Mark flows with a DSCP; a flow with the same match as an earlier one replaces it."""
        merged = {} if replace else {f.match_key(): f for f in self.rest}
        merged.update((f.match_key(), f) for f in flows)
        self._check(len(merged), sum(map(len, self.job_classes.values())))
        self.rest = list(merged.values())

    def remove_rest(self, flows: list[FlowClass] | None = None) -> None:
        """Unmark the given flows (matched by addresses and ports), or all of them."""
        drop = None if flows is None else {f.match_key() for f in flows}
        self.rest = [] if drop is None else [f for f in self.rest if f.match_key() not in drop]

    def register(self, job: RegisteredJob) -> None:
        """Schedule a training job's flows by its policy (a job of the same id is replaced), every
        job's in its band under their sharing policy (controller/sharing.py), which all name."""
        if job.job not in self.jobs and len(self.jobs) >= MAX_JOBS:
            raise CapacityError(f"job: {MAX_JOBS} jobs are registered, the most allowed "
                                "(DELETE /jobs/<id> first)")
        other = next((other for other in self.jobs.values() if other.job != job.job and other.sharing != job.sharing),
                     None)
        if other is not None:
            raise CapacityError(f"sharing: {job.sharing!r} is not allowed while job {other.job} is registered with "
                                f"sharing {other.sharing!r} (one policy shares the fabric; DELETE /jobs/<id> first)")
        jobs = {**self.jobs, job.job: job}
        bands, classes = self._classes(jobs, changed=job.job)
        self._check(len(self.rest), sum(map(len, classes.values())))
        self.jobs, self.job_bands, self.job_classes = jobs, bands, classes

    def remove(self, job_id: str) -> bool:
        """Unregister a job (the others' bands follow); False when no such job is registered."""
        if job_id not in self.jobs:
            return False
        self.jobs = {other: job for other, job in self.jobs.items() if other != job_id}
        self.job_bands, self.job_classes = self._classes(self.jobs)
        return True

    def _classes(self, jobs: dict[str, RegisteredJob], changed: str | None = None
                 ) -> tuple[dict[str, tuple[int, ...]], dict[str, list[FlowClass]]]:
        """Every job's band and rewrites under their sharing; a job whose band stayed keeps its
        rewrites (under `fair` only the changed job's are made)."""
        bands = sharing_of(list(jobs.values())).bands
        classes = {job_id: self.job_classes[job_id] if job_id != changed and self.job_bands.get(job_id) == band
                   else job_flow_classes(jobs[job_id], band) for job_id, band in bands.items()}
        return bands, classes

    @staticmethod
    def _check(rest: int, jobs: int) -> None:
        if rest + jobs > MAX_MARKS:
            raise CapacityError(f"flows: {rest} REST marks and {jobs} of jobs would be kept, "
                                f"more than the {MAX_MARKS} allowed (DELETE some first)")


def marks_by_switch(view: FabricView,
                    classes: list[FlowClass]) -> dict[int | None, dict[tuple, FlowClass]]:
    """Every mark by the switch it goes on, its flow's ingress switch (None: source not learnt),
    keyed by match."""
    wanted: dict[int | None, dict[tuple, FlowClass]] = {}
    for flow in classes:
        wanted.setdefault(ingress_switch(view, flow), {})[flow.match_key()] = flow
    return wanted


def mark_changes(have: Mapping[tuple, FlowClass], wanted: Mapping[tuple, FlowClass]) -> list[tuple]:
    """The match keys whose mark must be added, replaced or removed on a switch."""
    return ([key for key, flow in wanted.items() if have.get(key) != flow]
            + [key for key in have if key not in wanted])


def mark_match(flow: FlowClass) -> Match:
    fields = {"eth_type": ETH_IP, "ipv4_src": flow.src}
    if flow.dst:
        fields["ipv4_dst"] = flow.dst
    if flow.in_dscp is not None:
        fields["ip_dscp"] = flow.in_dscp
    if flow.proto:
        fields["ip_proto"] = PROTOCOLS[flow.proto]
        if flow.sport:
            fields[f"{flow.proto}_src"] = flow.sport
        if flow.dport:
            fields[f"{flow.proto}_dst"] = (flow.dport if flow.dport_mask is None
                                           else (flow.dport, flow.dport_mask))
    return openflow.match(**fields)


def mark_priority(flow: FlowClass) -> int:
    return PRIO_MARK if flow.in_dscp is None else PRIO_MARK_BY_DSCP


def mark_update(old: FlowClass | None, new: FlowClass | None) -> Message | None:
    """The flow-mod that turns a switch's mark for one match from `old` into `new` (None: no
    mark); None when it already is."""
    if new is not None and new != old:
        # Same match and priority: an add replaces the mark.
        return openflow.flow_add(CLASSIFY_TABLE, mark_priority(new), mark_match(new),
                                 [openflow.set_dscp(new.dscp)], goto=FORWARD_TABLE)
    if new is None and old is not None:
        return openflow.flow_delete_strict(CLASSIFY_TABLE, mark_priority(old), mark_match(old))
    return None


# -- ARP ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArpDecision:
    """`learnt`: the sender was learnt or moved (plan the routes before the packet goes);
    `packet_outs`: where the packet goes, as (dpid, packet-out)."""
    learnt: bool
    packet_outs: list[tuple[int, Message]]


class Arp:
    """All ARP comes to the controller: it learns the sender and hands the packet to the
    target's port, or, for a target not known yet, floods it to every edge port of the fabric
    (never into it: no loops) but the one it came from."""

    def __init__(self) -> None:
        self.recent_floods: dict[tuple[str, str], float] = {}  # (sender, target) -> when

    def packet_in(self, view: FabricView, dpid: int, in_port: int, packet: arp.arp, data: bytes,
                  now: float) -> ArpDecision | None:
        """What to do with ARP `packet` (raw frame `data`) that came in on (dpid, in_port) at
        time `now`; None for our own flood coming back through another switch."""
        key = (packet.src_ip, packet.dst_ip)
        if packet.opcode == arp.ARP_REQUEST and \
                now - self.recent_floods.get(key, float("-inf")) < FLOOD_ECHO_S:
            return None
        learnt = view.learn_host(packet.src_ip, packet.src_mac, dpid, in_port)
        target = view.hosts.get(packet.dst_ip)
        if target is not None:
            outputs = [(target.dpid, target.port)]
        else:
            self.recent_floods[key] = now
            outputs = [(d, port) for d in view.switches for port in view.edge_ports(d)
                       if (d, port) != (dpid, in_port)]
        return ArpDecision(learnt, [(d, openflow.packet_out(port, data)) for d, port in outputs])


# -- packets held behind barriers -----------------------------------------------------------------
class Held:
    """Packet-outs waiting for the replies to barrier requests, each (dpid, the request): a
    request's xid is set when it is sent, after it was decided."""

    def __init__(self, awaited: list[tuple[int, Message]], packet_outs: list[tuple[int, Message]]):
        self.awaited = list(awaited)
        self.packet_outs = packet_outs


class HeldPackets:
    """Packets released only once the switches have applied what was sent before them."""

    def __init__(self) -> None:
        self._held: list[Held] = []

    def hold(self, awaited: list[tuple[int, Message]], packet_outs: list[tuple[int, Message]]) -> Held:
        """Hold `packet_outs` until each barrier request (dpid, request) in `awaited` is answered."""
        held = Held(awaited, packet_outs)
        self._held.append(held)
        return held

    def answered(self, dpid: int, xid: int) -> list[tuple[int, Message]]:
        """A barrier reply: the packet-outs it was the last wait of."""
        released = []
        for held in list(self._held):
            held.awaited = [(d, request) for d, request in held.awaited if (d, request.xid) != (dpid, xid)]
            if not held.awaited:
                released += self.release(held)
        return released

    def release(self, held: Held) -> list[tuple[int, Message]]:
        """`held`'s packet-outs if they are still held (a switch never answered), else none."""
        if held not in self._held:
            return []
        self._held.remove(held)
        return held.packet_outs
