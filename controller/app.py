"""The fabric controller's Ryu app: each Ryu event becomes a call of the ControllerCore
(controller/core.py), whose answer it sends; it also runs the probe and statistics loops and the
REST API (controller/rest.py). Run it with `python -m controller` (or see README for ryu-manager).
"""
from __future__ import annotations

import gc
import logging
import time

from ryu import cfg
from ryu.base import app_manager
from ryu.controller import ofp_event
from ryu.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from ryu.lib import hub
from ryu.ofproto import ofproto_v1_5

import controller.flags  # noqa: F401  (registers the [fabric] options)
from controller import openflow
from controller.core import Answer, ControllerCore
from controller.options import RYU_GROUP, app_options, load_hosts
from controller.rest import RestApi, cooperatively, serve
from controller.stats import PortStatsWriter

LOG = logging.getLogger("fabric")

# A packet held until the switches confirm its route (barrier replies) goes anyway after this long.
RELEASE_TIMEOUT_S = 1.0


class FabricController(app_manager.RyuApp):
    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        options = app_options(cfg.CONF[RYU_GROUP])
        self.core = ControllerCore(options.lb, load_hosts(options.hosts_file) if options.hosts_file else ())
        logging.getLogger().addHandler(self.core.errors)
        self.datapaths: dict = {}  # dpid -> its connection (Ryu's Datapath)
        self.stats_writer = PortStatsWriter(options.stats_csv) if options.stats_csv else None
        self.stats_interval, self.probe_interval = options.stats_interval, options.probe_interval
        self.wsgi = RestApi(self.core, self.send)
        self.threads += [hub.spawn(self._probe_loop), hub.spawn(self._stats_loop)]
        LOG.info("fabric controller up: lb=%s", self.core.lb)

    def start(self) -> None:
        super().start()
        self.threads.append(serve(self.wsgi, cfg.CONF.wsapi_host, cfg.CONF.wsapi_port))
        # The ~140k objects of Ryu's and our modules live as long as the process; a full
        # garbage collection walking them held everything (OpenFlow, REST) for 60-100 ms.
        gc.collect()
        gc.freeze()

    # -- sending ------------------------------------------------------------------------------
    def send(self, answer: Answer) -> None:
        """Send what the core answered (a packet it holds goes at the latest after
        RELEASE_TIMEOUT_S), then the marks that changed."""
        for dpid, msg in answer.messages:
            self.send_msg(dpid, msg)
        if (held := answer.held) is not None:
            hub.spawn_after(RELEASE_TIMEOUT_S, lambda: self.send(self.core.release(held)))
        self.install_marks()

    def install_marks(self) -> None:
        """Bring every switch's marks to the wanted ones, yielding to the other green threads
        meanwhile (a REST request may change them again: the core then starts over)."""
        for dpid, msg in cooperatively(self.core.mark_updates()):
            self.send_msg(dpid, msg)

    def send_msg(self, dpid: int, msg) -> None:
        """To the switch's connection, if it is still connected (sending sets the xid)."""
        if (dp := self.datapaths.get(dpid)) is not None:
            msg.datapath = dp
            dp.send_msg(msg)

    # -- events -------------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features_handler(self, ev) -> None:
        dp = ev.msg.datapath
        self.datapaths[dp.id] = dp
        self.send(self.core.switch_connected(dp.id))

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def port_desc_reply_handler(self, ev) -> None:
        self.send(self.core.port_description(ev.msg.datapath.id, *openflow.port_description(ev.msg.body)))

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def state_change_handler(self, ev) -> None:
        dp = ev.datapath
        if dp.id is None or self.datapaths.get(dp.id) is not dp:
            return  # a stale connection of a switch that has already reconnected
        del self.datapaths[dp.id]
        self.send(self.core.switch_gone(dp.id))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def port_status_handler(self, ev) -> None:
        port = ev.msg.desc
        self.send(self.core.port_status(ev.msg.datapath.id, port.port_no, port.name.decode(),
                                        openflow.port_is_up(port), openflow.is_port_deleted(ev.msg.reason)))

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in_handler(self, ev) -> None:
        msg = ev.msg
        self.send(self.core.packet_in(msg.datapath.id, msg.match["in_port"], bytes(msg.data), time.monotonic()))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply_handler(self, ev) -> None:
        self.send(self.core.barrier_reply(ev.msg.datapath.id, ev.msg.xid))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply_handler(self, ev) -> None:
        rows = self.core.port_stats_reply(ev.msg.datapath.id, ev.msg.body, time.time())
        if self.stats_writer and rows:
            self.stats_writer.write(rows)

    @set_ev_cls(ofp_event.EventOFPGroupStatsReply, MAIN_DISPATCHER)
    def group_stats_reply_handler(self, ev) -> None:
        self.core.group_stats_reply(ev.msg.datapath.id, ev.msg.body)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error_msg_handler(self, ev) -> None:
        msg = ev.msg
        LOG.error("OpenFlow error from %016x: type=%d code=%d data=%s", msg.datapath.id,
                  msg.type, msg.code, msg.data[:64].hex())

    # -- loops --------------------------------------------------------------------------------
    def _probe_loop(self) -> None:
        while True:
            hub.sleep(self.probe_interval)
            self.send(self.core.probe_all())

    def _stats_loop(self) -> None:
        while True:
            hub.sleep(self.stats_interval)
            self.send(self.core.stats_requests())
