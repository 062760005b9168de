"""The switch, host and link classes a fabric Topo carries (`cls=`), so `mn --custom` needs no flags.

Only the standard library and Mininet are imported: `mn` runs this under /usr/bin/python3.
"""
from __future__ import annotations

import shlex
import socket

from mininet.link import Intf, Link
from mininet.log import warn
from mininet.node import Host, OVSSwitch, RemoteController
from mininet.util import errRun

from common.owner import OWNER_KEY
from topologies.marks import HAND_RUN, interface_alias
from topologies.tcp import DEFAULT_TCP_CC, check_tcp_cc
from common.frames import DEFAULT_MTU, check_mtu
from topologies.shaping import htb_priority_tree, offloads_off

DEFAULT_QUEUE_BYTES = 256 * 1024
LISTEN_CHECK_S = 5.0
OVS_TIMEOUT_S = 5


class OVSUserSwitch(OVSSwitch):
    """Userspace Open vSwitch (this kernel has no openvswitch module) speaking OpenFlow 1.3 and 1.5
    (1.5 for group selection methods that hash UDP ports), its bridge and ports marked as `owner`'s
    (topologies/marks.py: hand-run unless a fabric claimed the Topo)."""

    def __init__(self, name: str, owner: str = HAND_RUN, **params):
        self.owner = owner
        params.setdefault("datapath", "user")
        params.setdefault("protocols", "OpenFlow13,OpenFlow15")
        params.setdefault("failMode", "secure")
        super().__init__(name, **params)

    def intfOpts(self, intf) -> str:
        """Each port marked as its owner's and, for a shaped link, at the link's MTU (OVS's own
        request, so it never resets the port to another)."""
        opts = super().intfOpts(intf)
        extra = f" external_ids:{OWNER_KEY}={self.owner}"
        if getattr(intf, "mtu", None):
            extra += f" mtu_request={intf.mtu}"
        return (opts or f" -- set Interface {intf}") + extra

    def start(self, controllers) -> None:
        super().start(controllers)
        self.vsctl(f"-- br-set-external-id {self.name} {OWNER_KEY} {self.owner}")
        if not self.batch:
            self.started()

    @classmethod
    def batchStartup(cls, switches, run=errRun):
        started = super().batchStartup(switches, run)
        for switch in switches:
            switch.started()
        return started

    @classmethod
    def batchShutdown(cls, switches, run=errRun):
        """Mininet's, with its ovs-vsctl bounded: unbounded, it waits forever for an ovs-vswitchd
        that stopped (the change is in the database; a new ovs-vswitchd will not add the bridge)."""
        def bounded(command, **kwargs):
            return run(command.replace("ovs-vsctl ", f"ovs-vsctl --timeout={OVS_TIMEOUT_S} ", 1), **kwargs)
        return super().batchShutdown(switches, run=bounded)

    def started(self) -> None:
        """Once OVS has the bridge: mark the bridge's own port, a tap device that outlives
        ovs-vswitchd (persistent), as its owner's, and shape the ports."""
        self.cmd(f"ip link set dev {self.name} alias {shlex.quote(interface_alias(self.owner))}")
        self.reshape()

    def reshape(self) -> None:
        """OVS resets the root qdisc of a port it adds: shape the ports again once they are in."""
        for intf in self.intfList():
            if isinstance(intf, ShapedIntf):
                intf.shape()


class FabricHost(Host):
    """A host whose TCP congestion control is pinned (new namespaces inherit the machine's default,
    which may be anything: bbr on these machines), and whose connections may reuse a source port
    whose last connection to the same peer lingers in TIME_WAIT (tcp_tw_reuse, safe with TCP
    timestamps): the runner dials from the same ports in every run with the same seed
    (experiments/source_ports.py).  Both are settings of the host's own namespace."""

    def config(self, tcp_cc: str = DEFAULT_TCP_CC, **params) -> dict:
        result = super().config(**params)
        out = self.cmd(f"sysctl -qw net.ipv4.tcp_congestion_control={check_tcp_cc(tcp_cc)} 2>&1")
        if out.strip():
            raise RuntimeError(f"tcp_cc {tcp_cc} on {self.name} failed: {out.strip()}")
        out = self.cmd("sysctl -qw net.ipv4.tcp_tw_reuse=1 2>&1")
        if out.strip():
            raise RuntimeError(f"tcp_tw_reuse on {self.name} failed: {out.strip()}")
        self.tcp_cc = tcp_cc
        return result


class ShapedIntf(Intf):
    """A veth end at the link's MTU, marked as its owner's (its alias, for clean-up), with offloads
    off and its egress shaped by the 8-class priority tree.

    Both ends are shaped: a switch port queues like a real switch's, and a host's end is its NIC,
    which must cap what a host sends (a parameter server may not push n links' worth at once)."""

    def config(self, bw: float | None = None, queue_bytes: int = DEFAULT_QUEUE_BYTES,
               mtu: int = DEFAULT_MTU, owner: str = HAND_RUN, **params) -> dict:
        result = super().config(**params)
        self.mtu = check_mtu(mtu)
        self._run(f"ip link set dev {self.name} mtu {mtu} alias {shlex.quote(interface_alias(owner))}")
        self.cmd(offloads_off(self.name))
        self.bw, self.queue_bytes = bw, queue_bytes
        self.shape()
        return result

    def _run(self, command: str) -> None:
        out = self.cmd(f"{command} 2>&1")
        if out.strip():
            raise RuntimeError(f"`{command}` failed: {out.strip()}")

    def shape(self) -> None:
        if self.bw is not None:
            # One tc process for the whole tree, fed through the node's own shell (which may be on
            # another server: topologies/cluster.py).
            lines = htb_priority_tree(self.name, self.bw, self.queue_bytes, self.mtu)
            out = self.cmd(f"printf '%s\\n' {' '.join(map(shlex.quote, lines))} | tc -batch - 2>&1")
            if "rror" in out or "RTNETLINK" in out:
                raise RuntimeError(f"tc on {self.name} failed: {out.strip()}")


class FabricLink(Link):
    """A veth link at `bw` Mbit/s and `mtu` bytes with the shaping of ShapedIntf on both ends."""

    def __init__(self, node1, node2, bw: float | None = None,
                 queue_bytes: int = DEFAULT_QUEUE_BYTES, mtu: int = DEFAULT_MTU, **params):
        super().__init__(node1, node2, cls1=ShapedIntf, cls2=ShapedIntf,
                         bw=bw, queue_bytes=queue_bytes, mtu=mtu, **params)


class FabricController(RemoteController):
    """Mininet's RemoteController with a binary-safe check that the controller listens: Mininet's
    reads `telnet`'s output through a strict UTF-8 decoder, and when our controller's OpenFlow hello
    (random transaction id) arrived before telnet quit, starting the network failed with
    UnicodeDecodeError. A plain TCP connect says the same."""

    def isListening(self, ip: str, port: int) -> bool:
        try:
            with socket.create_connection((ip, port), timeout=LISTEN_CHECK_S):
                return True
        except OSError:
            warn(f"Unable to contact the remote controller at {ip}:{port}\n")
            return False
