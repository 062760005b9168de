"""A fake OpenFlow 1.5 switch and a fake fabric of them, for unit tests of what the controller
sends (no Open vSwitch, no Ryu event loop).

`FakeSwitch.apply` takes the messages as a switch receives them: serialized, and flow-mods and
group-mods parsed back from the bytes. It keeps flow tables and select groups, and refuses what
OVS refuses of what the controller uses (a match field without its prerequisite, a flow using a
group it does not have); deleting a group deletes the flows using it, as OpenFlow says.
`FakeSwitch.process` follows a packet (a dict of match fields) through the tables and returns
every way it can leave: one per choice of bucket in each select group it crosses, a bucket
whose watched port is down never chosen.

`FakeFabric` wires fake switches as a FabricView's links and hosts and follows a packet from a
host, or a packet-out from the controller, to wherever it ends. `FakeNetwork` connects such a
fabric to a controller and runs the exchange (port descriptions, packet-ins, barrier replies):
`CoreNetwork` to a ControllerCore, tests/unit/controller/test_app.py's to the Ryu app.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ryu.lib.packet import arp, ethernet, ipv4, packet, tcp, udp
from ryu.ofproto import ofproto_parser
from ryu.ofproto import ofproto_v1_5 as ofp
from ryu.ofproto import ofproto_v1_5_parser as parser

from controller import openflow
from controller.core import Answer, ControllerCore
from controller.topology import FabricView

Packet = dict  # match field -> value: in_port, eth_type, ipv4_src, ..., ip_dscp
CONTROLLER = "controller"
MAX_HOPS = 16
# Wire values written out here, not taken from controller/openflow.py: a wrong one there must
# not decode right here.
OFPGC_ADD_OR_MOD = 0x8000  # OVS's add-or-replace group command
NTR_VENDOR_ID, NTRT_SELECTION_METHOD = 0x0000154D, 1  # the selection-method group property
IP_FIELDS = {"ipv4_src", "ipv4_dst", "ip_proto", "ip_dscp"}
L4_PROTO = {"tcp_src": 6, "tcp_dst": 6, "udp_src": 17, "udp_dst": 17}
FIELDS = {"in_port", "eth_type"} | IP_FIELDS | set(L4_PROTO)
ETH_IP, ETH_ARP = 0x0800, 0x0806


class FakeSwitchError(Exception):
    """A message a real switch would refuse, or one this fake does not model."""


class _Wire:
    """What serializing a message needs of a datapath."""
    ofproto, ofproto_parser = ofp, parser


def received(msg: parser.MsgBase) -> parser.MsgBase:
    """`msg` as the switch gets it: serialized, and flow-mods and group-mods parsed back."""
    msg.datapath = _Wire()
    if msg.xid is None:
        msg.set_xid(1)
    msg.serialize()
    if isinstance(msg, parser.OFPFlowMod):
        return ofproto_parser.msg(_Wire(), *ofproto_parser.header(msg.buf), bytes(msg.buf))
    if isinstance(msg, parser.OFPGroupMod):
        return parse_group_mod(bytes(msg.buf))
    return msg


def parse_group_mod(buf: bytes) -> parser.OFPGroupMod:
    """A group-mod from its bytes. Not Ryu's parser: it reads each bucket's properties up to
    the end of the message, and loops forever on a group of two buckets with properties."""
    command, type_, group_id, buckets_len, _ = struct.unpack_from(
        ofp.OFP_GROUP_MOD_PACK_STR, buf, ofp.OFP_HEADER_SIZE)
    offset, end = ofp.OFP_GROUP_MOD_SIZE, ofp.OFP_GROUP_MOD_SIZE + buckets_len
    buckets = []
    while offset < end:
        (length,) = struct.unpack_from("!H", buf, offset)
        buckets.append(parser.OFPBucket.parser(buf[offset:offset + length], 0))
        offset += length
    properties, rest = [], buf[end:]
    while rest:
        prop, rest = parser.OFPGroupProp.parse(rest)
        properties.append(prop)
    return parser.OFPGroupMod(None, command, type_, group_id, buckets=buckets,
                              properties=properties)


def fields_of(data: bytes) -> Packet:
    """The match fields of a raw Ethernet frame (IPv4, TCP and UDP ones when it has them)."""
    pkt = packet.Packet(data)
    fields = {"eth_type": pkt.get_protocol(ethernet.ethernet).ethertype}
    if (ip := pkt.get_protocol(ipv4.ipv4)) is not None:
        fields.update(ipv4_src=ip.src, ipv4_dst=ip.dst, ip_proto=ip.proto, ip_dscp=ip.tos >> 2)
    for proto in (tcp.tcp, udp.udp):
        if (l4 := pkt.get_protocol(proto)) is not None:
            name = proto.__name__
            fields.update({f"{name}_src": l4.src_port, f"{name}_dst": l4.dst_port})
    return fields


def host_mac(host: str) -> str:
    """The MAC address of the test host with IPv4 address `host` (its last byte)."""
    return f'02:00:00:00:00:{int(host.rsplit(".", 1)[1]):02x}'


def arp_frame(opcode: int, src: str, dst: str) -> bytes:
    """An ARP request or reply (`opcode`) from host `src` about host `dst`, broadcast."""
    frame = packet.Packet()
    frame.add_protocol(ethernet.ethernet("ff:ff:ff:ff:ff:ff", host_mac(src), ETH_ARP))
    frame.add_protocol(arp.arp(opcode=opcode, src_mac=host_mac(src), src_ip=src,
                               dst_mac="00:00:00:00:00:00", dst_ip=dst))
    frame.serialize()
    return bytes(frame.data)


def tcp_frame(src: str, dst: str, dport: int = 5001) -> bytes:
    """A TCP segment from host `src` to host `dst`."""
    frame = packet.Packet()
    frame.add_protocol(ethernet.ethernet(host_mac(dst), host_mac(src), ETH_IP))
    frame.add_protocol(ipv4.ipv4(src=src, dst=dst, proto=6))
    frame.add_protocol(tcp.tcp(src_port=40000, dst_port=dport))
    frame.serialize()
    return bytes(frame.data)


def _bits(name: str, value: object) -> int:
    return int(ipaddress.IPv4Address(value)) if name.startswith("ipv4_") else int(value)


def matches(match: Mapping[str, object], pkt: Packet) -> bool:
    """Whether `pkt` has every field of `match` with its value (under its mask, if any)."""
    for name, want in match.items():
        if name not in pkt:
            return False
        value, mask = want if isinstance(want, tuple) else (want, None)
        have, value = _bits(name, pkt[name]), _bits(name, value)
        mask = -1 if mask is None else _bits(name, mask)
        if have & mask != value & mask:
            return False
    return True


def check_prerequisites(match: Mapping[str, object], where: str) -> None:
    """OVS refuses a match on a field whose prerequisite is not matched too (OFPBMC_BAD_PREREQ)."""
    unknown = set(match) - FIELDS
    if unknown:
        raise FakeSwitchError(f"{where}: match field {sorted(unknown)[0]} is not modelled")
    if set(match) & (IP_FIELDS | set(L4_PROTO)) and match.get("eth_type") != ETH_IP:
        raise FakeSwitchError(f"{where}: IPv4 fields without eth_type=0x0800: {dict(match)}")
    for name, proto in L4_PROTO.items():
        if name in match and match.get("ip_proto") != proto:
            raise FakeSwitchError(f"{where}: {name} without ip_proto={proto}: {dict(match)}")


@dataclass(frozen=True)
class Entry:
    priority: int
    match: dict
    instructions: list


@dataclass(frozen=True)
class Bucket:
    watch_port: int | None
    actions: list


@dataclass(frozen=True)
class Group:
    group_id: int
    buckets: list[Bucket]
    selection_method: str  # "" for OVS's default hash

    def ports(self) -> list[int]:
        """The ports its buckets output to, in bucket order."""
        return [a.port for b in self.buckets for a in b.actions
                if isinstance(a, parser.OFPActionOutput)]


def selection_method(properties: list) -> str:
    """The selection method named by a group's experimenter property ("" without one)."""
    for prop in properties:
        if isinstance(prop, parser.OFPGroupPropExperimenter) and \
                (prop.experimenter, prop.exp_type) == (NTR_VENDOR_ID, NTRT_SELECTION_METHOD):
            body = struct.pack(f"!{len(prop.data)}I", *prop.data)
            return body[4:20].rstrip(b"\0").decode()
        raise FakeSwitchError(f"group property not modelled: {prop}")
    return ""


def _uses_group(entry: Entry, group_id: int | None) -> bool:
    """Whether the flow outputs to group `group_id` (any group when None)."""
    return any(isinstance(a, parser.OFPActionGroup) and group_id in (None, a.group_id)
               for i in entry.instructions if isinstance(i, parser.OFPInstructionActions)
               for a in i.actions)


class FakeSwitch:
    def __init__(self, dpid: int, ports: Iterable[int]) -> None:
        self.dpid = dpid
        self.ports = set(ports)
        self.dead: set[int] = set()  # ports whose link is down
        self.tables: dict[int, list[Entry]] = {}
        self.groups: dict[int, Group] = {}
        self.barriers = 0

    # -- messages -----------------------------------------------------------------------------
    def apply(self, messages: Iterable[parser.MsgBase]) -> None:
        for msg in messages:
            msg = received(msg)
            if isinstance(msg, parser.OFPFlowMod):
                self._flow_mod(msg)
            elif isinstance(msg, parser.OFPGroupMod):
                self._group_mod(msg)
            elif isinstance(msg, parser.OFPBarrierRequest):
                self.barriers += 1
            else:
                raise FakeSwitchError(f"{self.dpid:x}: message not modelled: {msg}")

    def _flow_mod(self, msg: parser.OFPFlowMod) -> None:
        match = dict(msg.match.items())
        if msg.command == ofp.OFPFC_DELETE and msg.table_id == ofp.OFPTT_ALL and not match:
            self.tables.clear()
            return
        if msg.command not in (ofp.OFPFC_ADD, ofp.OFPFC_DELETE_STRICT) or \
                msg.table_id > ofp.OFPTT_MAX:
            raise FakeSwitchError(f"{self.dpid:x}: flow-mod not modelled: {msg}")
        table = self.tables.setdefault(msg.table_id, [])
        same = [e for e in table if (e.priority, e.match) == (msg.priority, match)]
        for entry in same:  # an add replaces the flow of the same match and priority
            table.remove(entry)
        if msg.command == ofp.OFPFC_DELETE_STRICT:
            if (msg.out_port, msg.out_group) != (ofp.OFPP_ANY, ofp.OFPG_ANY):
                raise FakeSwitchError(f"{self.dpid:x}: filtered delete not modelled: {msg}")
            return
        where = f"{self.dpid:x} table {msg.table_id}"
        check_prerequisites(match, where)
        for inst in msg.instructions:
            if isinstance(inst, parser.OFPInstructionGotoTable) and inst.table_id <= msg.table_id:
                raise FakeSwitchError(f"{where}: goto_table must go forward: {msg}")
            for action in getattr(inst, "actions", []):
                if isinstance(action, parser.OFPActionGroup) and action.group_id not in self.groups:
                    raise FakeSwitchError(f"{where}: group {action.group_id} does not exist")
                if isinstance(action, parser.OFPActionSetField) and \
                        action.key in IP_FIELDS and match.get("eth_type") != ETH_IP:
                    raise FakeSwitchError(f"{where}: set_field {action.key} on non-IPv4: {msg}")
        table.append(Entry(msg.priority, match, msg.instructions))

    def _group_mod(self, msg: parser.OFPGroupMod) -> None:
        if msg.command == ofp.OFPGC_DELETE:
            gone = None if msg.group_id == ofp.OFPG_ALL else msg.group_id
            for table in self.tables.values():
                table[:] = [e for e in table if not _uses_group(e, gone)]
            if gone is None:
                self.groups.clear()
            else:
                self.groups.pop(gone, None)
            return
        if msg.command != OFPGC_ADD_OR_MOD or msg.type != ofp.OFPGT_SELECT:
            raise FakeSwitchError(f"{self.dpid:x}: group-mod not modelled: {msg}")
        buckets = []
        for bucket in msg.buckets:
            watch = [p.watch for p in bucket.properties
                     if isinstance(p, parser.OFPGroupBucketPropWatch)
                     and p.type == ofp.OFPGBPT_WATCH_PORT]
            buckets.append(Bucket(watch[0] if watch else None, bucket.actions))
        self.groups[msg.group_id] = Group(msg.group_id, buckets, selection_method(msg.properties))

    # -- packets ------------------------------------------------------------------------------
    def flows(self, table: int) -> list[Entry]:
        return list(self.tables.get(table, []))

    def lookup(self, table: int, pkt: Packet) -> Entry | None:
        """The flow that takes `pkt` in `table`; two at the same top priority is an error (OVS
        would pick either)."""
        hits = [e for e in self.tables.get(table, []) if matches(e.match, pkt)]
        if not hits:
            return None
        top = max(e.priority for e in hits)
        best = [e for e in hits if e.priority == top]
        if len(best) > 1:
            raise FakeSwitchError(f"{self.dpid:x} table {table}: {len(best)} flows of priority "
                                  f"{top} match {pkt}")
        return best[0]

    def process(self, pkt: Packet, in_port: int | str) -> list[list[tuple[int | str, Packet]]]:
        """Every way `pkt`, arriving on `in_port`, can leave: each a list of (port or
        CONTROLLER, the packet as sent). A port that is down, or the arrival port, sends
        nothing; a packet no flow takes leaves nowhere ([])."""
        return self._table(0, {**pkt, "in_port": in_port})

    def _table(self, table: int, pkt: Packet) -> list[list[tuple[int | str, Packet]]]:
        entry = self.lookup(table, pkt)
        if entry is None:
            return [[]]
        ways, goto = [([], pkt)], None
        for inst in entry.instructions:
            if isinstance(inst, parser.OFPInstructionGotoTable):
                goto = inst.table_id
            elif isinstance(inst, parser.OFPInstructionActions) and \
                    inst.type == ofp.OFPIT_APPLY_ACTIONS:
                ways = [way for out, p in ways for way in self._actions(inst.actions, out, p)]
            else:
                raise FakeSwitchError(f"{self.dpid:x}: instruction not modelled: {inst}")
        if goto is None:
            return [out for out, _ in ways]
        return [out + more for out, p in ways for more in self._table(goto, p)]

    def _actions(self, actions: list, out: list, pkt: Packet) -> list[tuple[list, Packet]]:
        ways = [(list(out), dict(pkt))]
        for action in actions:
            if isinstance(action, parser.OFPActionOutput):
                port = CONTROLLER if action.port == ofp.OFPP_CONTROLLER else action.port
                for sent, p in ways:
                    if port == CONTROLLER or (port in self.ports - self.dead
                                              and port != p["in_port"]):
                        sent.append((port, dict(p)))
            elif isinstance(action, parser.OFPActionSetField):
                for _, p in ways:
                    p[action.key] = action.value
            elif isinstance(action, parser.OFPActionGroup):
                group = self.groups[action.group_id]
                live = [b for b in group.buckets if b.watch_port is None
                        or b.watch_port in self.ports - self.dead]
                if live:  # no live bucket: the group drops the packet
                    ways = [way for sent, p in ways for b in live
                            for way in self._actions(b.actions, sent, p)]
            else:
                raise FakeSwitchError(f"{self.dpid:x}: action not modelled: {action}")
        return ways


@dataclass(frozen=True)
class Delivery:
    """One way a packet went: `end` is a host's address, CONTROLLER, or "dropped" (no flow
    took it, or it left through a port with nothing behind); `hops` the switches it crossed,
    each with the packet as that switch sent it on (or as it came, where it was dropped)."""
    end: str
    hops: tuple[tuple[int, Packet], ...]
    data: bytes = field(default=b"", compare=False)

    @property
    def path(self) -> tuple[int, ...]:
        return tuple(dpid for dpid, _ in self.hops)

    @property
    def packet(self) -> Packet:
        """The packet as it arrived at its end."""
        return self.hops[-1][1]


class FakeFabric:
    """Fake switches wired as `view`'s links, its hosts on their ports."""

    def __init__(self, view: FabricView) -> None:
        self.switches = {dpid: FakeSwitch(dpid, s.ports) for dpid, s in view.switches.items()}
        for dpid, s in view.switches.items():
            self.switches[dpid].dead = {p for p, (_, up) in s.ports.items() if not up}
        self.links = dict(view.links)
        self.hosts = {(h.dpid, h.port): h.ip for h in view.hosts.values()}
        self.host_ports = {ip: end for end, ip in self.hosts.items()}

    def apply(self, changes: Mapping[int, list[parser.MsgBase]]) -> None:
        """Each switch's messages, in order."""
        for dpid, messages in changes.items():
            self.switches[dpid].apply(messages)

    def cut(self, end: tuple[int, int]) -> tuple[int, int]:
        """Take the link at `end` = (dpid, port) down at both ends; returns the far end."""
        peer = self.links[end]
        for dpid, port in (end, peer):
            self.switches[dpid].dead.add(port)
        return peer

    def send(self, src: str, pkt: Packet, data: bytes = b"") -> list[Delivery]:
        """Every way a packet sent by host `src` ends."""
        dpid, port = self.host_ports[src]
        return self._arrive(dpid, port, pkt, data, ())

    def packet_out(self, dpid: int, msg: parser.OFPPacketOut) -> list[Delivery]:
        """Where a packet-out the controller sends to switch `dpid` ends."""
        msg = received(msg)
        pkt = fields_of(msg.data)
        ends = []
        for action in msg.actions:
            if not isinstance(action, parser.OFPActionOutput):
                raise FakeSwitchError(f"packet-out action not modelled: {action}")
            if action.port not in self.switches[dpid].dead:
                ends += self._leave(dpid, action.port, pkt, msg.data, ((dpid, pkt),))
        return ends

    def _arrive(self, dpid: int, in_port: int, pkt: Packet, data: bytes,
                hops: tuple) -> list[Delivery]:
        if len(hops) >= MAX_HOPS:
            raise FakeSwitchError(f"loop: {[hex(d) for d, _ in hops]}")
        ends = []
        for way in self.switches[dpid].process(pkt, in_port):
            if not way:
                ends.append(Delivery("dropped", hops + ((dpid, pkt),), data))
            for port, sent in way:
                ends += self._leave(dpid, port, sent, data, hops + ((dpid, sent),))
        return ends

    def _leave(self, dpid: int, port: int | str, pkt: Packet, data: bytes,
               hops: tuple) -> list[Delivery]:
        if port == CONTROLLER:
            return [Delivery(CONTROLLER, hops, data)]
        if (dpid, port) in self.links:
            return self._arrive(*self.links[(dpid, port)], pkt, data, hops)
        return [Delivery(self.hosts.get((dpid, port), "dropped"), hops, data)]


class FakeNetwork:
    """Fake switches wired as `wiring` (a FabricView of the real fabric, which the controller
    does not see), connected to a controller. What the controller sends waits in each switch's
    outbox until `run` hands it over; what the switches answer (a port description, packet-ins,
    barrier replies) goes back to the controller as events, through the methods a subclass
    defines: `switch_features`, `port_desc_reply`, `switch_gone`, `port_status`, `packet_in`,
    `barrier_reply`."""

    def __init__(self, wiring: FabricView) -> None:
        self.wiring = wiring
        self.fabric = FakeFabric(wiring)
        self.outbox: dict[int, list] = {dpid: [] for dpid in self.fabric.switches}
        self.xids = dict.fromkeys(self.fabric.switches, 0)
        self.received: dict[str, list[bytes]] = {}  # host -> frames it got
        self.hold_barriers = False
        self.barrier_replies: list[tuple[int, int]] = []  # (dpid, xid) held back

    # -- what the controller's events are (a subclass's) -----------------------------------
    def switch_features(self, dpid: int) -> None:
        raise NotImplementedError

    def port_desc_reply(self, dpid: int, ports: list[parser.OFPPort]) -> None:
        raise NotImplementedError

    def switch_gone(self, dpid: int) -> None:
        raise NotImplementedError

    def port_status(self, dpid: int, port: parser.OFPPort, reason: int) -> None:
        raise NotImplementedError

    def packet_in(self, dpid: int, in_port: int, data: bytes) -> None:
        raise NotImplementedError

    def barrier_reply(self, dpid: int, xid: int) -> None:
        raise NotImplementedError

    # -- the network ------------------------------------------------------------------------
    def queue(self, dpid: int, msg: parser.MsgBase) -> None:
        """A message the controller sent to switch `dpid` (its connection sets the xid)."""
        if msg.xid is None:
            self.xids[dpid] += 1
            msg.set_xid(self.xids[dpid])
        self.outbox[dpid].append(msg)

    def run(self) -> None:
        """Hand what the controller sent to the switches, and what they answer to the
        controller, until nothing moves (barrier replies wait while `hold_barriers`)."""
        while any(self.outbox.values()):
            for dpid, box in self.outbox.items():
                while box:
                    self.switch_gets(dpid, box.pop(0))

    def switch_gets(self, dpid: int, msg: parser.MsgBase) -> None:
        if isinstance(msg, parser.OFPPortDescStatsRequest):
            self.port_desc_reply(dpid, self.port_descs(dpid))
        elif isinstance(msg, parser.OFPPacketOut):
            for end in self.fabric.packet_out(dpid, msg):
                self.arrived(end)
        elif isinstance(msg, parser.OFPBarrierRequest):
            self.fabric.switches[dpid].apply([msg])
            if self.hold_barriers:
                self.barrier_replies.append((dpid, msg.xid))
            else:
                self.barrier_reply(dpid, msg.xid)
        elif not isinstance(msg, (parser.OFPPortStatsRequest, parser.OFPGroupStatsRequest)):
            self.fabric.switches[dpid].apply([msg])

    def connect(self, dpid: int) -> None:
        """Switch `dpid` connects (again): it answers the controller's requests."""
        self.switch_features(dpid)
        self.run()

    def release_barriers(self) -> None:
        replies, self.barrier_replies = self.barrier_replies, []
        for dpid, xid in replies:
            self.barrier_reply(dpid, xid)
        self.run()

    def port_descs(self, dpid: int) -> list[parser.OFPPort]:
        switch = self.wiring.switches[dpid]
        local = parser.OFPPort(port_no=ofp.OFPP_LOCAL, name=switch.name.encode(), config=0, state=0)
        return [local] + [self.port(dpid, p) for p in sorted(switch.ports)]

    def port(self, dpid: int, port: int) -> parser.OFPPort:
        down = port in self.fabric.switches[dpid].dead
        name = f"{self.wiring.switches[dpid].name}-eth{port}"
        return parser.OFPPort(port_no=port, name=name.encode(), config=0,
                              state=ofp.OFPPS_LINK_DOWN if down else 0)

    def arrived(self, end: Delivery) -> None:
        if end.end == CONTROLLER:
            dpid, pkt = end.hops[-1]
            self.packet_in(dpid, pkt["in_port"], end.data)
        elif end.end != "dropped":
            self.received.setdefault(end.end, []).append(end.data)

    def send(self, host: str, data: bytes) -> list[Delivery]:
        """Host `host` sends the frame `data`; every way it can end."""
        ends = self.fabric.send(host, fields_of(data), data)
        for end in ends:
            self.arrived(end)
        self.run()
        return ends

    def cut(self, end: tuple[int, int]) -> None:
        """A link goes down: each end's switch reports its port."""
        for dpid, port in (end, self.fabric.cut(end)):
            self.port_status(dpid, self.port(dpid, port), ofp.OFPPR_MODIFY)
        self.run()


class CoreNetwork(FakeNetwork):
    """A FakeNetwork whose controller is a ControllerCore (controller/core.py), driven as the
    Ryu app drives it: each event is the core's call, its answer is sent, then the marks that
    changed. Packets the core holds behind barriers wait in `held` (the app releases them after
    a timeout: `core.release`). `now` is the clock the core is told."""

    def __init__(self, core: ControllerCore, wiring: FabricView, now: float = 0.0) -> None:
        super().__init__(wiring)
        self.core, self.now = core, now
        self.held: list = []

    def deliver(self, answer: Answer) -> None:
        for dpid, msg in answer.messages:
            self.queue(dpid, msg)
        if answer.held is not None:
            self.held.append(answer.held)
        for dpid, msg in self.core.mark_updates():
            self.queue(dpid, msg)

    def disconnect(self, dpid: int) -> None:
        """Switch `dpid`'s connection closes (what was on its way is lost)."""
        self.outbox[dpid].clear()
        self.switch_gone(dpid)
        self.run()

    def switch_features(self, dpid: int) -> None:
        self.deliver(self.core.switch_connected(dpid))

    def port_desc_reply(self, dpid: int, ports: list[parser.OFPPort]) -> None:
        self.deliver(self.core.port_description(dpid, *openflow.port_description(ports)))

    def switch_gone(self, dpid: int) -> None:
        self.deliver(self.core.switch_gone(dpid))

    def port_status(self, dpid: int, port: parser.OFPPort, reason: int) -> None:
        self.deliver(self.core.port_status(dpid, port.port_no, port.name.decode(), openflow.port_is_up(port),
                                           openflow.is_port_deleted(reason)))

    def packet_in(self, dpid: int, in_port: int, data: bytes) -> None:
        self.deliver(self.core.packet_in(dpid, in_port, data, self.now))

    def barrier_reply(self, dpid: int, xid: int) -> None:
        self.deliver(self.core.barrier_reply(dpid, xid))
