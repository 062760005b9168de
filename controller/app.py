"""The fabric controller: the Ryu app. It receives Ryu's events, asks controller/pipeline.py what
to send, sends it, keeps what each switch has, and runs the probe and statistics loops; the REST
API (controller/rest.py) changes the wanted marks through it and reads it through
controller/views.py. Run it with `python -m controller` (or see README for plain ryu-manager).
"""
from __future__ import annotations

import gc
import json
import logging
import time
from pathlib import Path
from typing import Iterable, Iterator

from ryu import cfg
from ryu.app.wsgi import WSGIApplication
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.lib.packet import arp, ethernet, ipv4, packet
from ryu.ofproto import ofproto_v1_5

import controller.flags  # noqa: F401  (registers the [fabric] options)
from controller import openflow, pipeline, views
from controller.openflow import ETH_ARP, ETH_IP, ETH_LLDP, Message
from controller.priority import FlowClass, parse_int, parse_ipv4
from controller.rest import FabricRestController, cooperatively, serve
from controller.routing import SwitchPlan, plan_fabric
from controller.scheduling import RegisteredJob
from controller.stats import PortStatsWriter
from controller.topology import FabricView, Host

LOG = logging.getLogger("fabric")

# A packet held until the switches confirm its route (barrier replies) goes anyway after this long.
RELEASE_TIMEOUT_S = 1.0


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
        self.wanted = pipeline.WantedMarks()  # the marks wanted (REST, jobs)
        # Bumped whenever the wanted marks may change; apply_marks starts over when it moved.
        self.marks_epoch = 0
        self._wanted: tuple[int, dict[int | None, dict[tuple, FlowClass]]] = (-1, {})
        self.arp = pipeline.Arp()
        self.held = pipeline.HeldPackets()
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

    # -- sending ------------------------------------------------------------------------------
    @staticmethod
    def send(dp, messages: Iterable[Message]) -> None:
        for msg in messages:
            msg.datapath = dp
            dp.send_msg(msg)  # sets its xid

    def send_packet_outs(self, packet_outs: list[tuple[int, Message]]) -> None:
        """Each (dpid, packet-out) to its switch, if it is still connected."""
        for dpid, msg in packet_outs:
            if (dp := self.datapaths.get(dpid)) is not None:
                self.send(dp, [msg])

    # -- switch life cycle --------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features_handler(self, ev) -> None:
        """A switch (re)connected: it gets the base pipeline; its ports arrive in the
        port-description reply."""
        dp = ev.msg.datapath
        self.send(dp, pipeline.base_pipeline() + [openflow.port_desc_request()])
        self.installed[dp.id] = SwitchPlan()
        self.marks[dp.id] = {}

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def port_desc_reply_handler(self, ev) -> None:
        dp = ev.msg.datapath
        name, ports = f"{dp.id:016x}", {}
        for p in ev.msg.body:
            if p.port_no == openflow.OFPP_LOCAL:
                name = p.name.decode()
            elif p.port_no <= openflow.OFPP_MAX:
                ports[p.port_no] = (p.name.decode(), openflow.port_is_up(p))
        self.datapaths[dp.id] = dp
        self.view.add_switch(dp.id, name, ports)
        LOG.info("switch %s (%016x) connected with %d ports", name, dp.id, len(ports))
        self.recompute()
        self.send(dp, pipeline.probes(self.view, dp.id))

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

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def port_status_handler(self, ev) -> None:
        msg = ev.msg
        dp, port = msg.datapath, msg.desc
        if port.port_no > openflow.OFPP_MAX or dp.id not in self.view.switches:
            return
        if openflow.is_port_deleted(msg.reason):
            changed = self.view.delete_port(dp.id, port.port_no)
        else:
            up = openflow.port_is_up(port)
            changed = self.view.set_port(dp.id, port.port_no, port.name.decode(), up)
            if up:
                self.send(dp, [pipeline.probe(dp.id, port.port_no)])
        if changed:
            LOG.info("port %s of %s is %s", port.port_no, self.view.switches[dp.id].name,
                     "up" if self.view.port_up(dp.id, port.port_no) else "down")
            self.recompute()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error_msg_handler(self, ev) -> None:
        msg = ev.msg
        LOG.error("OpenFlow error from %016x: type=%d code=%d data=%s", msg.datapath.id,
                  msg.type, msg.code, msg.data[:64].hex())

    # -- discovery and ARP --------------------------------------------------------------------
    def _probe_loop(self) -> None:
        """Links come and go without a port-status at the far end; re-probe regularly."""
        while True:
            hub.sleep(self.probe_interval)
            for dpid, dp in list(self.datapaths.items()):
                self.send(dp, pipeline.probes(self.view, dpid))

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
            origin = pipeline.probe_origin(data[14:])
            if origin is not None and self.view.add_link(origin, (dp.id, in_port)):
                LOG.info("link %016x:%d <-> %016x:%d", *origin, dp.id, in_port)
                self.recompute()
        elif eth.ethertype == ETH_ARP:
            decision = self.arp.packet_in(self.view, dp.id, in_port, pkt.get_protocol(arp.arp),
                                          data, time.monotonic())
            if decision is not None:
                changed = self.recompute() if decision.learnt else set()
                self.after_barriers(changed, decision.packet_outs)
        elif eth.ethertype == ETH_IP:
            ip = pkt.get_protocol(ipv4.ipv4)
            if self.view.learn_host(ip.src, eth.src, dp.id, in_port):
                self.recompute()

    def after_barriers(self, dpids: set[int], packet_outs: list[tuple[int, Message]]) -> None:
        """Send `packet_outs` once every switch in `dpids` has answered a barrier, i.e. applied
        every flow sent to it before (see pipeline.RouteChanges.barriers)."""
        awaited = set()
        for dpid in dpids:
            if (dp := self.datapaths.get(dpid)) is not None:
                request = openflow.barrier()
                self.send(dp, [request])
                awaited.add((dpid, request.xid))
        if not awaited:
            self.send_packet_outs(packet_outs)
            return
        held = self.held.hold(awaited, packet_outs)
        # A switch that never answers: the packets go anyway.
        hub.spawn_after(RELEASE_TIMEOUT_S, lambda: self.send_packet_outs(self.held.release(held)))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply_handler(self, ev) -> None:
        self.send_packet_outs(self.held.answered(ev.msg.datapath.id, ev.msg.xid))

    # -- installing decisions -----------------------------------------------------------------
    def recompute(self) -> set[int]:
        """Plan every switch from the view and send each only what changed (then its marks);
        returns the DPIDs whose routes or groups changed."""
        plans = plan_fabric(self.view, self.lb)
        self.marks_epoch += 1  # a host may have moved to another switch
        changes = pipeline.route_changes(
            {dpid: self.installed.setdefault(dpid, SwitchPlan()) for dpid in self.datapaths}, plans)
        for dpid, dp in list(self.datapaths.items()):
            if dpid in changes.plans:
                self.installed[dpid] = changes.plans[dpid]
                self.send(dp, changes.messages[dpid])
            self.apply_marks(dp)
        return changes.barriers

    def wanted_marks(self) -> dict[int | None, dict[tuple, FlowClass]]:
        """Every mark by the switch it goes on, computed once per epoch."""
        epoch, wanted = self._wanted
        if epoch != self.marks_epoch:
            wanted = pipeline.marks_by_switch(self.view, self.wanted.classes())
            self._wanted = (self.marks_epoch, wanted)
        return wanted

    def apply_marks(self, dp) -> None:
        """Install the DSCP marks of flows whose source host attaches to this switch, remove
        the others. Thousands of flow-mods take long: it yields meanwhile (so does Ryu's send
        queue when full), and starts over when the wanted marks changed in between (another
        request, a host that moved) or stops when the switch left."""
        while self.datapaths.get(dp.id) is dp:
            epoch = self.marks_epoch
            wanted = self.wanted_marks().get(dp.id, {})
            have = self.marks.setdefault(dp.id, {})
            for key in cooperatively(pipeline.mark_changes(have, wanted)):
                if self.marks_epoch != epoch or self.datapaths.get(dp.id) is not dp:
                    break
                new = wanted.get(key)
                update = pipeline.mark_update(have.get(key), new)
                if update is None:
                    continue  # another request's pass got there first
                # Recorded before sending: a full send queue yields to that other pass.
                if new is None:
                    del have[key]
                else:
                    have[key] = new
                self.send(dp, [update])
            else:
                return

    def marks_changed(self) -> None:
        """Bring every switch's marks to the wanted ones (after a REST or job change)."""
        self.marks_epoch += 1
        for dp in list(self.datapaths.values()):
            self.apply_marks(dp)

    # -- API used by REST ---------------------------------------------------------------------
    def set_flow_classes(self, flows: list[FlowClass], replace: bool = False) -> None:
        """Mark flows with a DSCP; a flow with the same match as an earlier one replaces it.
        Raises CapacityError (nothing changed) past MAX_MARKS."""
        self.wanted.set_rest(flows, replace)
        self.marks_changed()

    def remove_flow_classes(self, flows: list[FlowClass] | None = None) -> None:
        """Unmark the given flows (matched by addresses and ports), or all of them."""
        self.wanted.remove_rest(flows)
        self.marks_changed()

    def register_job(self, job: RegisteredJob) -> None:
        """Schedule a training job's flows by its policy (a job of the same id is replaced).
        Raises CapacityError (nothing changed) past MAX_JOBS or MAX_MARKS."""
        self.wanted.register(job)
        self.marks_changed()

    def remove_job(self, job_id: str) -> bool:
        """Unmark a job's flows; False when no such job is registered."""
        if not self.wanted.remove(job_id):
            return False
        self.marks_changed()
        return True

    # -- statistics ---------------------------------------------------------------------------
    def _stats_loop(self) -> None:
        while True:
            hub.sleep(self.stats_interval)
            for dp in list(self.datapaths.values()):
                self.send(dp, [openflow.port_stats_request(), openflow.group_stats_request()])

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply_handler(self, ev) -> None:
        dp, now = ev.msg.datapath, time.time()
        switch = self.view.switches.get(dp.id)
        if switch is None:
            return
        rows = []
        for s in ev.msg.body:
            if s.port_no > openflow.OFPP_MAX:
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
        return views.describe(self.view, self.lb, self.errors.count)

    def describe_groups(self) -> dict:
        return views.describe_groups(self.view, self.installed, self.group_stats)

    def describe_flow_classes(self) -> list[dict]:
        return views.describe_flow_classes(self.view, self.wanted.rest)

    def describe_jobs(self) -> Iterator[dict]:
        return views.describe_jobs(self.wanted.jobs.values())

    def describe_ports(self) -> list[dict]:
        return views.describe_ports(self.port_stats)
