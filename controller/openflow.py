"""OpenFlow 1.5 messages the controller sends, built without a switch.

Every builder returns a fresh Ryu message with no datapath; the app sets `msg.datapath` when
it sends it (as FAUCET does), so the decisions that make these messages need no connection and
tests can apply them to a fake switch. A message is sent once: sending sets its xid.
"""
from __future__ import annotations

import struct
from typing import Iterable, Sequence

from ryu.ofproto import ofproto_v1_5 as ofp
from ryu.ofproto import ofproto_v1_5_parser as parser
from ryu.ofproto.ofproto_parser import MsgBase as Message

ETH_LLDP, ETH_ARP, ETH_IP = 0x88CC, 0x0806, 0x0800
NTR_VENDOR_ID, NTRT_SELECTION_METHOD = 0x0000154D, 1
OFPGC_ADD_OR_MOD = 0x8000  # OVS extension: add a group or replace it, i.e. idempotent
OFPP_MAX, OFPP_LOCAL = ofp.OFPP_MAX, ofp.OFPP_LOCAL
Match = parser.OFPMatch


# -- matches and actions --------------------------------------------------------------------------
def match(**fields: object) -> Match:
    return parser.OFPMatch(**fields)


def output(port: int, max_len: int = ofp.OFPCML_MAX) -> parser.OFPActionOutput:
    return parser.OFPActionOutput(port, max_len)


def to_controller(max_len: int = ofp.OFPCML_NO_BUFFER) -> parser.OFPActionOutput:
    """To the controller: the whole packet, or its first `max_len` bytes."""
    return parser.OFPActionOutput(ofp.OFPP_CONTROLLER, max_len)


def to_group(group_id: int) -> parser.OFPActionGroup:
    return parser.OFPActionGroup(group_id)


def set_dscp(dscp: int) -> parser.OFPActionSetField:
    return parser.OFPActionSetField(ip_dscp=dscp)


# -- flows ----------------------------------------------------------------------------------------
def flow_add(table: int, priority: int, match: Match, actions: Sequence = (),
             goto: int | None = None) -> Message:
    """Add a flow (an existing one with the same match and priority is replaced)."""
    inst = []
    if actions:
        inst.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, list(actions)))
    if goto is not None:
        inst.append(parser.OFPInstructionGotoTable(goto))
    return parser.OFPFlowMod(None, table_id=table, priority=priority, match=match,
                             instructions=inst)


def flow_delete_strict(table: int, priority: int, match: Match) -> Message:
    """Delete the one flow with exactly this match and priority."""
    return parser.OFPFlowMod(None, table_id=table, priority=priority, match=match,
                             command=ofp.OFPFC_DELETE_STRICT, out_port=ofp.OFPP_ANY,
                             out_group=ofp.OFPG_ANY)


def flows_delete_all() -> Message:
    """Delete every flow of every table."""
    return parser.OFPFlowMod(None, table_id=ofp.OFPTT_ALL, command=ofp.OFPFC_DELETE,
                             out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)


# -- groups ---------------------------------------------------------------------------------------
def selection_method_prop(method: str, param: int = 0) -> parser.OFPGroupPropExperimenter:
    """The OVS/Netronome group property choosing a select group's hash (OF1.5 experimenter).
    Body: 4 pad bytes, the method NUL-padded to 16 bytes, a 64-bit parameter; no fields."""
    body = bytes(4) + method.encode().ljust(16, b"\0") + struct.pack("!Q", param)
    return parser.OFPGroupPropExperimenter(
        type_=ofp.OFPGPT_EXPERIMENTER, experimenter=NTR_VENDOR_ID,
        exp_type=NTRT_SELECTION_METHOD, data=list(struct.unpack(f"!{len(body) // 4}I", body)))


def select_group(group_id: int, ports: Iterable[int], selection_method: str = "") -> Message:
    """Add or replace a select group of one bucket per port, each output to its port. Each
    bucket watches its port: OVS skips a bucket whose port is down before we even hear of it.
    An empty `selection_method` leaves OVS's default hash."""
    buckets = [parser.OFPBucket(
        bucket_id=i, actions=[output(port)],
        properties=[parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=port)])
        for i, port in enumerate(ports)]
    props = [selection_method_prop(selection_method)] if selection_method else []
    return parser.OFPGroupMod(None, command=OFPGC_ADD_OR_MOD, type_=ofp.OFPGT_SELECT,
                              group_id=group_id, buckets=buckets, properties=props)


def group_delete(group_id: int) -> Message:
    """Delete a select group (the switch also deletes the flows still using it)."""
    return parser.OFPGroupMod(None, command=ofp.OFPGC_DELETE, type_=ofp.OFPGT_SELECT,
                              group_id=group_id)


def groups_delete_all() -> Message:
    return parser.OFPGroupMod(None, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)


# -- packets, barriers, requests ------------------------------------------------------------------
def packet_out(port: int, data: bytes) -> Message:
    """Send `data` out of `port`, as if it came from the controller."""
    return parser.OFPPacketOut(None, buffer_id=ofp.OFP_NO_BUFFER,
                               match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
                               actions=[output(port)], data=data)


def barrier() -> Message:
    """The switch answers once it has applied every message sent before this one."""
    return parser.OFPBarrierRequest(None)


def port_desc_request() -> Message:
    return parser.OFPPortDescStatsRequest(None, 0)


def port_stats_request() -> Message:
    return parser.OFPPortStatsRequest(None, 0, ofp.OFPP_ANY)


def group_stats_request() -> Message:
    return parser.OFPGroupStatsRequest(None, 0, ofp.OFPG_ALL)


# -- what switches report -------------------------------------------------------------------------
def port_is_up(port: parser.OFPPort) -> bool:
    """A port (of a port description or status) is up: link up and not administratively down."""
    return not (port.state & ofp.OFPPS_LINK_DOWN or port.config & ofp.OFPPC_PORT_DOWN)


def port_description(ports: Iterable[parser.OFPPort]) -> tuple[str | None, dict[int, tuple[str, bool]]]:
    """A port-description reply's body as the switch's name (its local port's; None without
    one) and its ports: number -> (name, up)."""
    name, described = None, {}
    for port in ports:
        if port.port_no == OFPP_LOCAL:
            name = port.name.decode()
        elif port.port_no <= OFPP_MAX:
            described[port.port_no] = (port.name.decode(), port_is_up(port))
    return name, described


def is_port_deleted(reason: int) -> bool:
    """A port-status reason saying the port is gone."""
    return reason == ofp.OFPPR_DELETE
