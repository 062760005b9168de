"""A fabric across several machines, through Mininet Cluster Edition (`mininet.examples.cluster`,
shipped with Debian's mininet): the same Topo, its nodes placed on the listed servers by one of
Mininet's placers, links between nodes on different servers tunnelled (gretap) by Mininet, every
remote node's shell reached over SSH. docs/cluster.md has the set-up and what a tunnel costs.

The first server is this machine ("localhost"): it runs the controller and the runner and keeps
the results. A host app on another server writes its files there under the same path; the runner
copies them back (fetch) when the run ends.
"""
from __future__ import annotations

import shlex
import subprocess
from functools import cache
from typing import Callable

from mininet.examples.cluster import (MininetCluster, Placer, RemoteGRELink, RemoteMixin, RemoteOVSSwitch,
                                      RoundRobinPlacer, SwitchBinPlacer)
from mininet.util import errRun

from topologies.layout import Layout, Link
from topologies.nodes import FabricHost, FabricLink, OVSUserSwitch, ShapedIntf

# Mininet's deterministic placers (its RandomPlacer would place a run differently from its plan).
PLACERS: dict[str, type[Placer]] = {"switchbin": SwitchBinPlacer, "roundrobin": RoundRobinPlacer}
LOCAL = "localhost"
LOOPBACK = "127.0.0.1"


class ClusterError(RuntimeError):
    """A cluster that cannot be used; the message names the field (cluster.servers, cluster.placement)."""


def _placer_order(layout: Layout) -> list[str]:
    """The switches in the order the placers bin them: each tier spread evenly over the list
    (leaf i next to the spines of the same fraction of their tier), so that SwitchBinPlacer's
    contiguous bins each get a share of every tier and a leaf's hosts stay with it."""
    tiers: dict[str, list[str]] = {}
    for node in layout.switches:
        tiers.setdefault(node.role, []).append(node.name)
    position = {name: (index / len(names), role)
                for role, names in tiers.items() for index, name in enumerate(names)}
    return sorted(position, key=lambda name: (position[name], name))


def placement(layout: Layout, servers: list[str], method: str) -> dict[str, str]:
    """Which server each node of the fabric lands on (the run places it so: cluster_network)."""
    if method not in PLACERS:
        raise ClusterError(f"cluster.placement: {method!r} is not allowed (one of {', '.join(PLACERS)})")
    switches = _placer_order(layout)
    if method == "switchbin" and len(servers) > len(switches):
        raise ClusterError(f"cluster.placement: switchbin gives every server a switch; {len(servers)} servers "
                           f"but {len(switches)} switches (list fewer servers or use roundrobin)")
    hosts = [node.name for node in layout.hosts]
    links = [(link.a.name, link.b.name) for link in layout.links]
    placer = PLACERS[method](servers=servers, nodes=switches + hosts, hosts=hosts, switches=switches, links=links)
    return {name: placer.place(name) for name in switches + hosts}


def crossing_links(layout: Layout, where: dict[str, str]) -> list[Link]:
    """The links whose ends land on different servers (each one a gretap tunnel)."""
    return [link for link in layout.links if where[link.a.name] != where[link.b.name]]


def check_servers(servers: list[str], run: Callable = subprocess.run) -> None:
    """The first server is this machine and every other one answers a root SSH command without a
    password; ClusterError naming the first that does not."""
    if servers[0] != LOCAL:
        raise ClusterError(f"cluster.servers: the first server must be {LOCAL} (this machine runs the controller "
                           f"and keeps the results), not {servers[0]!r}")
    for server in servers[1:]:
        try:
            result = run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{server}", "true"],
                         capture_output=True, text=True)
        except FileNotFoundError:
            raise ClusterError("cluster.servers: ssh is not installed here "
                               "(make setup installs openssh-client)") from None
        if result.returncode != 0:
            said = (result.stderr or "").strip().splitlines()
            raise ClusterError(f"cluster.servers: {server} cannot be reached as root over SSH without a password "
                               f"({said[-1] if said else f'ssh exited with {result.returncode}'}); "
                               "docs/cluster.md says how to set up its keys")


def controller_address(servers: list[str], run: Callable = subprocess.run) -> str:
    """Where the controller listens for switches: 127.0.0.1 on one machine, else this machine's
    address towards the second server (what MininetCluster gives its switches)."""
    if all(server == LOCAL for server in servers):
        return LOOPBACK
    remote_ip = RemoteMixin.findServerIP(servers[1])
    route = run(["ip", "route", "get", remote_ip or servers[1]], capture_output=True, text=True).stdout.split()
    if "src" not in route:
        raise ClusterError(f"cluster.servers: no route from this machine to {servers[1]}")
    return route[route.index("src") + 1]


class RemoteFabricLink(RemoteGRELink):
    """FabricLink across servers: shaped ends at the fabric's MTU on a veth pair, or on a gretap
    tunnel between two servers (whose own network must carry the MTU plus 42 bytes)."""

    def __init__(self, node1, node2, **params):
        params.update(cls1=ShapedIntf, cls2=ShapedIntf)
        super().__init__(node1, node2, **params)


@cache
def remote(cls: type) -> type:
    """The class of a node of ours that may live on another server."""
    if issubclass(cls, OVSUserSwitch):
        def batch_startup(switch_cls, switches, run=errRun):
            """Each server's switches through a shell on that server (its ovs-vsctl)."""
            for server in sorted({switch.server for switch in switches}):
                group = [switch for switch in switches if switch.server == server]
                OVSUserSwitch.batchStartup.__func__(switch_cls, group, run=group[0].cmd)
            return switches
        return type(f"Remote{cls.__name__}", (RemoteMixin, cls),
                    {"batchStartup": classmethod(batch_startup),
                     "batchShutdown": classmethod(RemoteOVSSwitch.batchShutdown.__func__)})
    return type(f"Remote{cls.__name__}", (RemoteMixin, cls), {})


def cluster_network(topo, servers: list[str], method: str, **params) -> MininetCluster:
    """A MininetCluster of the Topo (not built): our node and link classes made remote-capable, every
    node on the server `placement` gives it."""
    where = placement(topo.layout, servers, method)
    for node in topo.nodes():
        info = topo.nodeInfo(node)
        if info.get("cls") in (OVSUserSwitch, FabricHost):
            info["cls"] = remote(info["cls"])
        info["server"] = where[node]
    for _, _, link in topo.links(withInfo=True):
        if link.get("cls") is FabricLink:
            link["cls"] = RemoteFabricLink
    return MininetCluster(topo=topo, servers=servers, placement=PLACERS[method], precheck=False, **params)


def popen_options(node) -> dict:
    """Node.popen options for a process of a node of these classes: Mininet's `mnexec -d` forks when
    the process already leads its group (RemoteMixin makes it), and the Popen would see the parent
    exit at once; without it the process is the Popen's own, its group's leader."""
    return {"mncmd": ["mnexec", "-a", str(node.pid)]} if isinstance(node, RemoteMixin) else {}


def server_of(node) -> str:
    return getattr(node, "server", LOCAL)


def make_dir(node, path: str) -> None:
    """The folder a host app writes into, on the node's server too."""
    if server_of(node) != LOCAL:
        node.rcmd(f"mkdir -p {shlex.quote(path)}")


def fetch(node, path: str) -> str:
    """What a host app wrote on another server, copied to the same path here; '' or what failed."""
    server = server_of(node)
    if server == LOCAL:
        return ""
    copy = subprocess.run(["scp", "-q", "-r", "-o", "BatchMode=yes", f"root@{server}:{path}/.", path],
                          capture_output=True, text=True)
    said = copy.stderr.strip().splitlines()
    return f"copying {path} from {server} failed: {said[-1] if said else copy.returncode}" if copy.returncode else ""


def kill_remote(node, marker: str) -> None:
    """Stop what is left of a host app on another server (killing its local ssh client does not):
    the processes whose command line holds `marker`, the run's random job number."""
    if server_of(node) != LOCAL:
        node.rcmd(f"pkill -f -- {shlex.quote(marker)}")
