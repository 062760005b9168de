"""A fabric across several machines, through Mininet Cluster Edition (`mininet.examples.cluster`,
shipped with Debian's mininet): the same Topo, its nodes placed on the listed servers as
topologies/cluster.py places them, links between nodes on different servers tunnelled (gretap) by Mininet, every
remote node's shell reached over SSH. docs/cluster.md has the set-up and what a tunnel costs.

The first server is this machine ("localhost"): it runs the controller and the runner and keeps
the results. A host app on another server writes its files there under the same path; the runner
copies them back (fetch) when the run ends.
"""
from __future__ import annotations

import functools
import shlex
import subprocess
from functools import cache
from typing import Callable

from mininet.examples.cluster import MininetCluster, Placer, RemoteGRELink, RemoteMixin, RemoteOVSSwitch
from mininet.util import errRun

from topologies.cluster import LOCAL, ClusterError, placement
from topologies.nodes import FabricHost, FabricLink, OVSUserSwitch, ShapedIntf

LOOPBACK = "127.0.0.1"


class FixedPlacer(Placer):
    """Mininet's placer interface over a placement computed beforehand (topologies/cluster.py)."""

    def __init__(self, where: dict[str, str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.where = where

    def place(self, node: str) -> str:
        return self.where[node]


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
    return MininetCluster(topo=topo, servers=servers, placement=functools.partial(FixedPlacer, where),
                          precheck=False, **params)


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
