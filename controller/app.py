"""The fabric controller: a Ryu app that learns the fabric and installs what `routing` decides.

Tables: 0 classifies (per-flow DSCP marks at the ingress switch, from REST and from registered
training jobs, then goto 1); 1 forwards
(host routes, probes and ARP to the controller, everything else dropped).
Run it with `python -m controller` (or see README for plain ryu-manager).
"""
from __future__ import annotations

import gc
import json
import logging
import struct
import time
from pathlib import Path
from typing import Callable, Iterator

from ryu import cfg
from ryu.app.wsgi import WSGIApplication
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, ipv4, packet
from ryu.ofproto import ofproto_v1_5

import controller.flags  # noqa: F401  (registers the [fabric] options)
from controller.priority import MAX_MARKS, PROTOCOLS, FlowClass, ingress_switch, parse_int, parse_ipv4
from controller.rest import CapacityError, FabricRestController, cooperatively, serve
from controller.routing import Group, Output, SwitchPlan, plan_fabric
from controller.scheduling import Job, describe_job, job_flow_classes
from controller.stats import PortStatsWriter
from controller.topology import FabricView, Host

LOG = logging.getLogger("fabric")

CLASSIFY_TABLE, FORWARD_TABLE = 0, 1
PRIO_PROBE, PRIO_ROUTE, PRIO_ARP, PRIO_IP_MISS = 1000, 500, 10, 5
# A mark that matches an incoming DSCP (LE -> droppable) wins over the per-flow marks.
PRIO_MARK, PRIO_MARK_BY_DSCP = 800, 900
ETH_LLDP, ETH_ARP, ETH_IP = 0x88CC, 0x0806, 0x0800
PROBE_DST_BYTES = bytes.fromhex("0180c200000e")  # LLDP nearest-bridge address
PROBE_SRC_BYTES = bytes.fromhex("020000000001")
PROBE_MAGIC = b"DNNTB-PROBE"
# An ARP request we flood may come back to us through the fabric; ignore such echoes this long.
FLOOD_ECHO_S = 0.5
# A packet held until the switches confirm its route (barrier replies) goes anyway after this long.
RELEASE_TIMEOUT_S = 1.0
NTR_VENDOR_ID, NTRT_SELECTION_METHOD = 0x0000154D, 1
OFPGC_ADD_OR_MOD = 0x8000  # OVS extension: add a group or replace it, i.e. idempotent
MAX_JOBS = 16  # registered training jobs (the runner registers one per run)


def selection_method_prop(parser, method: str, param: int = 0):
    """The OVS/Netronome group property choosing a select group's hash (OF1.5 experimenter).
    Body: 4 pad bytes, the method NUL-padded to 16 bytes, a 64-bit parameter; no fields."""
    body = bytes(4) + method.encode().ljust(16, b"\0") + struct.pack("!Q", param)
    return parser.OFPGroupPropExperimenter(
        type_=ofproto_v1_5.OFPGPT_EXPERIMENTER, experimenter=NTR_VENDOR_ID,
        exp_type=NTRT_SELECTION_METHOD, data=list(struct.unpack(f"!{len(body) // 4}I", body)))


def load_hosts(path: str) -> list[Host]:
    """The hosts file: a JSON list of {ip, mac, dpid, port}; a bad one stops the controller."""
    try:
        entries = json.loads(Path(path).read_text())
        return [Host(parse_ipv4("ip", e["ip"]), str(e["mac"]), parse_int("dpid", e["dpid"], 1, (1 << 64) - 1),
                     parse_int("port", e["port"], 1, 0xFFFFFF00)) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"error: --hosts-file {path}: {error}") from None


class ErrorCounter(logging.Handler):
    """Counts ERROR records (Ryu logs handler exceptions and never re-raises them) so the REST
    status and the tests can tell a broken controller from a slow network."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


class FabricController(app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        conf = cfg.CONF.fabric
        self.lb: str = conf.lb
        self.view = FabricView()
        self.datapaths: dict = {}
        self.installed: dict[int, SwitchPlan] = {}
        self.marks: dict[int, dict[tuple, FlowClass]] = {}  # dpid -> match key -> installed mark
        self.flow_classes: list[FlowClass] = []  # set over REST (/fabric/classes)
        self.jobs: dict[str, Job] = {}
        self.job_classes: dict[str, list[FlowClass]] = {}  # job id -> its rewrites
        # Bumped whenever the wanted marks may change; apply_marks starts over when it moved.
        self.marks_epoch = 0
        self._wanted: tuple[int, dict[int | None, dict[tuple, FlowClass]]] = (-1, {})
        self.recent_floods: dict[tuple[str, str], float] = {}
        # Packet-outs waiting for barrier replies: [(dpid, xid) still awaited, the release].
        self.pending_releases: list[list] = []
        self.port_stats: dict[int, dict[int, dict]] = {}
        self.group_stats: dict[int, dict[int, list[int]]] = {}
        self.errors = ErrorCounter()
        logging.getLogger().addHandler(self.errors)
        self.stats_writer = PortStatsWriter(conf.stats_csv) if conf.stats_csv else None
        self.stats_interval = conf.stats_interval
        for host in load_hosts(conf.hosts_file) if conf.hosts_file else []:
            self.view.pin_host(host)
        self.probe_interval = conf.probe_interval
        # Our own WSGI app and server, not Ryu's "wsgi" context: Ryu starts that server with
        # no connection limits or timeouts (see controller/rest.py).
        self.wsgi = WSGIApplication()
        self.wsgi.register(FabricRestController, {"fabric": self})
        self.threads.append(hub.spawn(self._probe_loop))
        self.threads.append(hub.spawn(self._stats_loop))
        LOG.info("fabric controller up: lb=%s", self.lb)

    def start(self) -> None:
        super().start()
        conf = cfg.CONF
        self.threads.append(serve(self.wsgi, conf.wsapi_host, conf.wsapi_port))
        # The ~140k objects of Ryu's and our modules live as long as the process; a full
        # garbage collection walking them held everything (OpenFlow, REST) for 60-100 ms.
        gc.collect()
        gc.freeze()

    # -- OpenFlow helpers ---------------------------------------------------------------------
    @staticmethod
    def add_flow(dp, table: int, priority: int, match, actions=None, goto: int | None = None) -> None:
        parser, ofp = dp.ofproto_parser, dp.ofproto
        inst = []
        if actions:
            inst.append(parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions))
        if goto is not None:
            inst.append(parser.OFPInstructionGotoTable(goto))
        dp.send_msg(parser.OFPFlowMod(datapath=dp, table_id=table, priority=priority,
                                      match=match, instructions=inst))

    @staticmethod
    def delete_flow(dp, table: int, priority: int, match) -> None:
        parser, ofp = dp.ofproto_parser, dp.ofproto
        dp.send_msg(parser.OFPFlowMod(datapath=dp, table_id=table, priority=priority, match=match,
                                      command=ofp.OFPFC_DELETE_STRICT, out_port=ofp.OFPP_ANY,
                                      out_group=ofp.OFPG_ANY))

    def output_actions(self, dp, out: Output) -> list:
        parser = dp.ofproto_parser
        if out.group_id is not None:
            return [parser.OFPActionGroup(out.group_id)]
        return [parser.OFPActionOutput(out.port)]

    def send_group(self, dp, group: Group) -> None:
        parser, ofp = dp.ofproto_parser, dp.ofproto
        # watch_port: OVS skips a bucket whose port is down before we even hear of it.
        buckets = [parser.OFPBucket(
            bucket_id=i, actions=[parser.OFPActionOutput(port)],
            properties=[parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=port)])
            for i, port in enumerate(group.ports)]
        props = [selection_method_prop(parser, group.selection_method)] \
            if group.selection_method else []
        dp.send_msg(parser.OFPGroupMod(dp, command=OFPGC_ADD_OR_MOD, type_=ofp.OFPGT_SELECT,
                                       group_id=group.group_id, buckets=buckets,
                                       properties=props))

    def delete_group(self, dp, group_id: int) -> None:
        parser, ofp = dp.ofproto_parser, dp.ofproto
        dp.send_msg(parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, type_=ofp.OFPGT_SELECT,
                                       group_id=group_id))

    @staticmethod
    def route_match(parser, ip: str):
        return parser.OFPMatch(eth_type=ETH_IP, ipv4_dst=ip)

    @staticmethod
    def mark_match(parser, flow: FlowClass):
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
        return parser.OFPMatch(**fields)

    @staticmethod
    def mark_priority(flow: FlowClass) -> int:
        return PRIO_MARK if flow.in_dscp is None else PRIO_MARK_BY_DSCP

    def packet_out(self, dp, port: int, data: bytes) -> None:
        parser, ofp = dp.ofproto_parser, dp.ofproto
        dp.send_msg(parser.OFPPacketOut(
            datapath=dp, buffer_id=ofp.OFP_NO_BUFFER,
            match=parser.OFPMatch(in_port=ofp.OFPP_CONTROLLER),
            actions=[parser.OFPActionOutput(port)], data=data))

    # -- switch life cycle --------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features_handler(self, ev) -> None:
        """A switch (re)connected: wipe what it had (it may be a new fabric) and install the base
        pipeline; its ports arrive in the port-description reply."""
        dp = ev.msg.datapath
        parser, ofp = dp.ofproto_parser, dp.ofproto
        dp.send_msg(parser.OFPFlowMod(datapath=dp, table_id=ofp.OFPTT_ALL,
                                      command=ofp.OFPFC_DELETE, out_port=ofp.OFPP_ANY,
                                      out_group=ofp.OFPG_ANY))
        dp.send_msg(parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL))
        self.add_flow(dp, CLASSIFY_TABLE, 0, parser.OFPMatch(), goto=FORWARD_TABLE)
        to_controller = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
        self.add_flow(dp, FORWARD_TABLE, PRIO_PROBE, parser.OFPMatch(eth_type=ETH_LLDP),
                      to_controller)
        # All ARP goes through the controller: it learns both ends and delivers to the target.
        self.add_flow(dp, FORWARD_TABLE, PRIO_ARP, parser.OFPMatch(eth_type=ETH_ARP),
                      to_controller)
        # Unknown IPv4 destinations: to the controller only to learn the sender, then dropped.
        self.add_flow(dp, FORWARD_TABLE, PRIO_IP_MISS, parser.OFPMatch(eth_type=ETH_IP),
                      [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, 128)])
        self.installed[dp.id] = SwitchPlan()
        self.marks[dp.id] = {}
        dp.send_msg(parser.OFPPortDescStatsRequest(dp, 0))

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def port_desc_reply_handler(self, ev) -> None:
        dp = ev.msg.datapath
        ofp = dp.ofproto
        name, ports = f"{dp.id:016x}", {}
        for p in ev.msg.body:
            if p.port_no == ofp.OFPP_LOCAL:
                name = p.name.decode()
            elif p.port_no <= ofp.OFPP_MAX:
                ports[p.port_no] = (p.name.decode(), self._port_is_up(ofp, p))
        self.datapaths[dp.id] = dp
        self.view.add_switch(dp.id, name, ports)
        LOG.info("switch %s (%016x) connected with %d ports", name, dp.id, len(ports))
        self.recompute()
        for port in self.view.switches[dp.id].live_ports():
            self.send_probe(dp, port)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def state_change_handler(self, ev) -> None:
        dp = ev.datapath
        if dp.id is None or self.datapaths.get(dp.id) is not dp:
            return  # a stale connection of a switch that has already reconnected
        LOG.info("switch %016x disconnected", dp.id)
        del self.datapaths[dp.id]
        self.installed.pop(dp.id, None)
        self.marks.pop(dp.id, None)
        self.port_stats.pop(dp.id, None)
        self.group_stats.pop(dp.id, None)
        if self.view.remove_switch(dp.id):
            self.recompute()

    @staticmethod
    def _port_is_up(ofp, port) -> bool:
        return not (port.state & ofp.OFPPS_LINK_DOWN or port.config & ofp.OFPPC_PORT_DOWN)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def port_status_handler(self, ev) -> None:
        msg = ev.msg
        dp, ofp, port = msg.datapath, msg.datapath.ofproto, msg.desc
        if port.port_no > ofp.OFPP_MAX or dp.id not in self.view.switches:
            return
        if msg.reason == ofp.OFPPR_DELETE:
            changed = self.view.delete_port(dp.id, port.port_no)
        else:
            up = self._port_is_up(ofp, port)
            changed = self.view.set_port(dp.id, port.port_no, port.name.decode(), up)
            if up:
                self.send_probe(dp, port.port_no)
        if changed:
            LOG.info("port %s of %s is %s", port.port_no, self.view.switches[dp.id].name,
                     "up" if self.view.port_up(dp.id, port.port_no) else "down")
            self.recompute()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error_msg_handler(self, ev) -> None:
        msg = ev.msg
        LOG.error("OpenFlow error from %016x: type=%d code=%d data=%s", msg.datapath.id,
                  msg.type, msg.code, msg.data[:64].hex())

    # -- discovery ----------------------------------------------------------------------------
    def send_probe(self, dp, port: int) -> None:
        """A discovery frame naming its origin (dpid, port); built by hand because Ryu's
        serializer pads a bare Ethernet header to 60 bytes before our payload."""
        header = PROBE_DST_BYTES + PROBE_SRC_BYTES + struct.pack("!H", ETH_LLDP)
        self.packet_out(dp, port, header + PROBE_MAGIC + struct.pack("!QI", dp.id, port))

    def _probe_loop(self) -> None:
        """Links come and go without a port-status at the far end; re-probe regularly."""
        while True:
            hub.sleep(self.probe_interval)
            for dpid, dp in list(self.datapaths.items()):
                switch = self.view.switches.get(dpid)
                for port in sorted(switch.live_ports()) if switch else ():
                    self.send_probe(dp, port)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in_handler(self, ev) -> None:
        msg = ev.msg
        dp = msg.datapath
        in_port = msg.match["in_port"]
        data = bytes(msg.data)
        pkt = packet.Packet(data)
        eth = pkt.get_protocol(ethernet.ethernet)
        if eth is None or dp.id not in self.view.switches:
            return
        if eth.ethertype == ETH_LLDP:
            self.probe_received(dp.id, in_port, data[14:])
        elif eth.ethertype == ETH_ARP:
            self.arp_received(dp, in_port, pkt.get_protocol(arp.arp), data)
        elif eth.ethertype == ETH_IP:
            ip = pkt.get_protocol(ipv4.ipv4)
            if self.view.learn_host(ip.src, eth.src, dp.id, in_port):
                self.recompute()

    def probe_received(self, dpid: int, in_port: int, payload: bytes) -> None:
        if not payload.startswith(PROBE_MAGIC):
            return
        src_dpid, src_port = struct.unpack_from("!QI", payload, len(PROBE_MAGIC))
        if self.view.add_link((src_dpid, src_port), (dpid, in_port)):
            LOG.info("link %016x:%d <-> %016x:%d", src_dpid, src_port, dpid, in_port)
            self.recompute()

    def arp_received(self, dp, in_port: int, arp_pkt, data: bytes) -> None:
        now = time.monotonic()
        key = (arp_pkt.src_ip, arp_pkt.dst_ip)
        if arp_pkt.opcode == arp.ARP_REQUEST and now - self.recent_floods.get(key, -1e9) < FLOOD_ECHO_S:
            return  # our own flood coming back through another switch
        changed = set()
        if self.view.learn_host(arp_pkt.src_ip, arp_pkt.src_mac, dp.id, in_port):
            changed = self.recompute()
        target = self.view.hosts.get(arp_pkt.dst_ip)
        if target is not None:
            # Routes to the target exist; hand the packet straight to its port.
            outputs = [(target.dpid, target.port)]
        else:
            # Unknown target: flood to every edge port of the fabric (never into it: no loops).
            self.recent_floods[key] = now
            outputs = [(dpid, port) for dpid in self.datapaths for port in self.view.edge_ports(dpid)
                       if (dpid, port) != (dp.id, in_port)]
        self.after_barriers(changed, lambda: self.packets_out(outputs, data))

    def packets_out(self, outputs: list[tuple[int, int]], data: bytes) -> None:
        for dpid, port in outputs:
            if (dp := self.datapaths.get(dpid)) is not None:
                self.packet_out(dp, port, data)

    def after_barriers(self, dpids: set[int], release: Callable[[], None]) -> None:
        """Run `release` once every switch in `dpids` has answered a barrier, i.e. applied every
        flow sent to it before. An ARP reply released at once let the first ping overtake its
        route on another switch's connection, and 1 in 30 first pings was lost."""
        waiting = set()
        for dpid in dpids:
            if (dp := self.datapaths.get(dpid)) is not None:
                request = dp.ofproto_parser.OFPBarrierRequest(dp)
                dp.send_msg(request)  # sets its xid
                waiting.add((dpid, request.xid))
        if not waiting:
            release()
            return
        pending = [waiting, release]
        self.pending_releases.append(pending)
        hub.spawn_after(RELEASE_TIMEOUT_S, self._release, pending)  # a switch that never answers

    def _release(self, pending: list) -> None:
        if pending in self.pending_releases:
            self.pending_releases.remove(pending)
            pending[1]()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply_handler(self, ev) -> None:
        answered = (ev.msg.datapath.id, ev.msg.xid)
        for pending in list(self.pending_releases):
            pending[0].discard(answered)
            if not pending[0]:
                self._release(pending)

    # -- installing decisions -----------------------------------------------------------------
    def recompute(self) -> set[int]:
        """Plan every switch from the view and send each only what changed; returns the DPIDs
        whose routes or groups changed."""
        plans = plan_fabric(self.view, self.lb)
        self.marks_epoch += 1  # a host may have moved to another switch
        changed = set()
        for dpid, dp in list(self.datapaths.items()):
            if self.apply_plan(dp, plans.get(dpid, SwitchPlan())):
                changed.add(dpid)
            self.apply_marks(dp)
        return changed

    def apply_plan(self, dp, plan: SwitchPlan) -> bool:
        """Send what differs from what the switch has; True when something did."""
        parser = dp.ofproto_parser
        old = self.installed.setdefault(dp.id, SwitchPlan())
        if old == plan:
            return False
        for gid, group in plan.groups.items():
            if old.groups.get(gid) != group:
                self.send_group(dp, group)
        for ip, out in plan.routes.items():
            if old.routes.get(ip) != out:
                self.add_flow(dp, FORWARD_TABLE, PRIO_ROUTE, self.route_match(parser, ip),
                              self.output_actions(dp, out))
        for ip in old.routes.keys() - plan.routes.keys():
            self.delete_flow(dp, FORWARD_TABLE, PRIO_ROUTE, self.route_match(parser, ip))
        if old.groups.keys() - plan.groups.keys():
            dp.send_msg(parser.OFPBarrierRequest(dp))  # flows off the groups before the groups go
            for gid in old.groups.keys() - plan.groups.keys():
                self.delete_group(dp, gid)
        self.installed[dp.id] = plan
        return True

    def all_flow_classes(self) -> list[FlowClass]:
        """The REST marks, then every job's (a later class for one match replaces an earlier)."""
        merged = {f.match_key(): f for f in self.flow_classes}
        merged.update((f.match_key(), f) for classes in self.job_classes.values() for f in classes)
        return list(merged.values())

    def wanted_marks(self) -> dict[int | None, dict[tuple, FlowClass]]:
        """Every mark by the switch it goes on (None: source not learnt), once per epoch."""
        epoch, wanted = self._wanted
        if epoch != self.marks_epoch:
            wanted = {}
            for f in self.all_flow_classes():
                wanted.setdefault(ingress_switch(self.view, f), {})[f.match_key()] = f
            self._wanted = (self.marks_epoch, wanted)
        return wanted

    def apply_marks(self, dp) -> None:
        """Install the DSCP marks of flows whose source host attaches to this switch, remove
        the others. Thousands of flow-mods take long: it yields meanwhile (so does Ryu's send
        queue when full), and starts over when the wanted marks changed in between (another
        request, a host that moved) or stops when the switch left."""
        parser = dp.ofproto_parser
        while self.datapaths.get(dp.id) is dp:
            epoch = self.marks_epoch
            wanted = self.wanted_marks().get(dp.id, {})
            have = self.marks.setdefault(dp.id, {})
            changes = [key for key, flow in wanted.items() if have.get(key) != flow]
            changes += [key for key in have if key not in wanted]
            for key in cooperatively(changes):
                if self.marks_epoch != epoch or self.datapaths.get(dp.id) is not dp:
                    break
                flow = wanted.get(key)
                if flow is not None and have.get(key) != flow:
                    # Same match and priority: OFPFC_ADD replaces the mark.
                    self.add_flow(dp, CLASSIFY_TABLE, self.mark_priority(flow),
                                  self.mark_match(parser, flow),
                                  [parser.OFPActionSetField(ip_dscp=flow.dscp)],
                                  goto=FORWARD_TABLE)
                    have[key] = flow
                elif flow is None and (old := have.pop(key, None)) is not None:
                    self.delete_flow(dp, CLASSIFY_TABLE, self.mark_priority(old),
                                     self.mark_match(parser, old))
            else:
                return

    def marks_changed(self) -> None:
        """Bring every switch's marks to the wanted ones (after a REST or job change)."""
        self.marks_epoch += 1
        for dp in list(self.datapaths.values()):
            self.apply_marks(dp)

    def check_marks(self, rest: int, jobs: int) -> None:
        """Refuse a change that would leave more than MAX_MARKS marks in all."""
        if rest + jobs > MAX_MARKS:
            raise CapacityError(f"flows: {rest} REST marks and {jobs} of jobs would be kept, "
                                f"more than the {MAX_MARKS} allowed (DELETE some first)")

    # -- API used by REST and later policies ----------------------------------------------------
    def set_flow_classes(self, flows: list[FlowClass], replace: bool = False) -> None:
        """Mark flows with a DSCP; a flow with the same match as an earlier one replaces it.
        Raises CapacityError (nothing changed) past MAX_MARKS."""
        merged = {} if replace else {f.match_key(): f for f in self.flow_classes}
        merged.update((f.match_key(), f) for f in flows)
        self.check_marks(len(merged), sum(map(len, self.job_classes.values())))
        self.flow_classes = list(merged.values())
        self.marks_changed()

    def remove_flow_classes(self, flows: list[FlowClass] | None = None) -> None:
        """Unmark the given flows (matched by addresses and ports), or all of them."""
        drop = None if flows is None else {f.match_key() for f in flows}
        self.flow_classes = [] if drop is None else [
            f for f in self.flow_classes if f.match_key() not in drop]
        self.marks_changed()

    def register_job(self, job: Job) -> None:
        """Schedule a training job's flows by its policy (a job of the same id is replaced).
        Raises CapacityError (nothing changed) past MAX_JOBS or MAX_MARKS."""
        if job.job not in self.jobs and len(self.jobs) >= MAX_JOBS:
            raise CapacityError(f"job: {MAX_JOBS} jobs are registered, the most allowed "
                                "(DELETE /jobs/<id> first)")
        classes = job_flow_classes(job)
        self.check_marks(len(self.flow_classes), len(classes) + sum(
            len(c) for other, c in self.job_classes.items() if other != job.job))
        self.jobs[job.job], self.job_classes[job.job] = job, classes
        self.marks_changed()

    def remove_job(self, job_id: str) -> bool:
        """Unmark a job's flows; False when no such job is registered."""
        if self.jobs.pop(job_id, None) is None:
            return False
        del self.job_classes[job_id]
        self.marks_changed()
        return True

    # -- statistics ---------------------------------------------------------------------------
    def _stats_loop(self) -> None:
        while True:
            hub.sleep(self.stats_interval)
            for dp in list(self.datapaths.values()):
                parser, ofp = dp.ofproto_parser, dp.ofproto
                dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
                dp.send_msg(parser.OFPGroupStatsRequest(dp, 0, ofp.OFPG_ALL))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply_handler(self, ev) -> None:
        dp, now = ev.msg.datapath, time.time()
        switch = self.view.switches.get(dp.id)
        if switch is None:
            return
        rows = []
        for s in ev.msg.body:
            if s.port_no > dp.ofproto.OFPP_MAX:
                continue
            row = {"time_s": round(now, 3), "switch": switch.name, "port": s.port_no,
                   "tx_bytes": s.tx_bytes, "rx_bytes": s.rx_bytes, "tx_packets": s.tx_packets,
                   "rx_packets": s.rx_packets, "tx_dropped": s.tx_dropped,
                   "rx_dropped": s.rx_dropped}
            self.port_stats.setdefault(dp.id, {})[s.port_no] = row
            rows.append(row)
        if self.stats_writer and rows:
            self.stats_writer.write(rows)

    @set_ev_cls(ofp_event.EventOFPGroupStatsReply, MAIN_DISPATCHER)
    def group_stats_reply_handler(self, ev) -> None:
        dp = ev.msg.datapath
        self.group_stats[dp.id] = {g.group_id: [b.packet_count for b in g.bucket_stats]
                                   for g in ev.msg.body}

    # -- read-only views for REST -------------------------------------------------------------
    def describe(self) -> dict:
        view = self.view
        name = {d: s.name for d, s in view.switches.items()}
        return {
            "lb": self.lb,
            "errors": self.errors.count,
            "switches": [{"dpid": f"{d:016x}", "name": s.name, "ports": {
                str(p): {"name": n, "up": up, "peer": self._peer_name(d, p, name)}
                for p, (n, up) in sorted(s.ports.items())}} for d, s in sorted(view.switches.items())],
            "links": sorted({tuple(sorted([(name.get(a[0], a[0]), a[1]), (name.get(b[0], b[0]), b[1])]))
                             for a, b in view.links.items()}),
            "hosts": [{"ip": h.ip, "mac": h.mac, "switch": name.get(h.dpid), "port": h.port}
                      for h in sorted(view.hosts.values(), key=lambda h: (h.dpid, h.port))],
        }

    def _peer_name(self, dpid: int, port: int, name: dict) -> str | None:
        peer = self.view.links.get((dpid, port))
        if peer:
            return f"{name.get(peer[0])}:{peer[1]}"
        host = next((h.ip for h in self.view.hosts.values() if (h.dpid, h.port) == (dpid, port)), None)
        return host

    def describe_groups(self) -> dict:
        return {self.view.switches[d].name: [
            {"group_id": g.group_id, "ports": list(g.ports),
             "selection_method": g.selection_method or "default",
             "bucket_packets": self.group_stats.get(d, {}).get(g.group_id)}
            for g in sorted(plan.groups.values(), key=lambda g: g.group_id)]
            for d, plan in self.installed.items() if d in self.view.switches}

    def describe_flow_classes(self) -> list[dict]:
        return [{**f.to_dict(), "switch": (self.view.switches[d].name
                                           if (d := ingress_switch(self.view, f)) in self.view.switches
                                           else None)} for f in self.flow_classes]

    def describe_jobs(self) -> Iterator[dict]:
        """Each job as GET /jobs shows it, one at a time (REST yields in between)."""
        return (describe_job(job) for job in list(self.jobs.values()))

    def describe_ports(self) -> list[dict]:
        return [row for ports in self.port_stats.values() for row in ports.values()]
