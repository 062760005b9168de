"""A fabric across several machines, through Mininet Cluster Edition (`mininet.examples.cluster`,
shipped with Debian's mininet): the same Topo, its nodes placed on the listed servers as
topologies/cluster.py places them, links between nodes on different servers tunnelled (VXLAN, vxlan_tunnel), every
remote node's shell reached over SSH. docs/cluster.md has the set-up and what a tunnel costs.

The first server is this machine ("localhost"): it runs the controller and the runner and keeps
the results. A host app on another server writes its files there under the same path; the runner
copies them back (fetch) when the run ends.
"""
from __future__ import annotations

import csv
import functools
import os
import shlex
import signal
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Callable

from mininet.examples.cluster import MininetCluster, Placer, RemoteGRELink, RemoteMixin, RemoteOVSSwitch
from mininet.util import errRun

from common.files import atomic_open
from topologies.cluster import LOCAL, ClusterError, placement
from topologies.marks import HAND_RUN, interface_alias
from topologies.nodes import FabricHost, FabricLink, OVSUserSwitch, ShapedIntf

LOOPBACK = "127.0.0.1"


class FixedPlacer(Placer):
    """Mininet's placer interface over a placement computed beforehand (topologies/cluster.py)."""

    def __init__(self, where: dict[str, str], **kwargs) -> None:
        super().__init__(**kwargs)
        self.where = where

    def place(self, node: str) -> str:
        return self.where[node]


def local_address_towards(address: str, run: Callable = subprocess.run) -> str | None:
    """This machine's address on its route to `address` (what the server reaches it by)."""
    route = run(["ip", "route", "get", address], capture_output=True, text=True).stdout.split()
    return route[route.index("src") + 1] if "src" in route else None


def controller_address(servers: list[str], run: Callable = subprocess.run) -> str:
    """Where the controller listens for switches: 127.0.0.1 on one machine, else this machine's
    address towards the second server (what MininetCluster gives its switches)."""
    if all(server == LOCAL for server in servers):
        return LOOPBACK
    address = local_address_towards(RemoteMixin.findServerIP(servers[1]) or servers[1], run)
    if address is None:
        raise ClusterError(f"cluster.servers: no route from this machine to {servers[1]}")
    return address


VXLAN_PORT = 4789
VXLAN_OVERHEAD = 50  # outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14: the underlay's MTU above the fabric's


def vxlan_tunnel(node1, node2, name1: str, name2: str, addr1: str | None, addr2: str | None, vni: int,
                 local_ip: str, move: Callable, owner: str = HAND_RUN) -> None:
    """One crossing link: a VXLAN device on each node's server, `local_ip` (node1's server) and
    node2's server address its ends, moved into each node (`move(name, node)`). The kernels of this
    machine kind have VXLAN built in and no GRE at all. Each end carries its owner's mark from the
    moment it exists, so a fabric killed while it builds leaves no tunnel clean-up cannot find."""
    for node, name, addr, local, remote_ip in ((node1, name1, addr1, local_ip, node2.serverIP),
                                               (node2, name2, addr2, node2.serverIP, local_ip)):
        node.rcmd(f"ip link delete {shlex.quote(name)}")
        said = node.rcmd(f"ip link add name {shlex.quote(name)} type vxlan id {vni} local {local} "
                         f"remote {remote_ip} dstport {VXLAN_PORT}")
        if said.strip():
            raise ClusterError(f"cluster: making the VXLAN end {name} on {node.server} failed: {said.strip()}")
        node.rcmd(f"ip link set dev {shlex.quote(name)} alias {shlex.quote(interface_alias(owner))}")
        if addr:
            node.rcmd(f"ip link set {shlex.quote(name)} address {addr}")
        node.rcmd(f"ip link set dev {shlex.quote(name)} up")
        move(name, node)


class RemoteFabricLink(RemoteGRELink):
    """FabricLink across servers: shaped ends at the fabric's MTU on a veth pair, or on a VXLAN
    tunnel between two servers (whose own network must carry the MTU plus VXLAN_OVERHEAD bytes)."""

    vni = 0  # one per crossing link of the fabric, the same at both ends

    def __init__(self, node1, node2, **params):
        params.update(cls1=ShapedIntf, cls2=ShapedIntf)
        self.owner = params.get("owner", HAND_RUN)
        super().__init__(node1, node2, **params)

    def makeTunnel(self, node1, node2, intfname1, intfname2, addr1=None, addr2=None):
        if node2.server == LOCAL:  # this machine's end first: its address is found by route
            node1, node2, intfname1, intfname2, addr1, addr2 = node2, node1, intfname2, intfname1, addr2, addr1
        local_ip = controller_address([node1.server, node2.server]) if node1.server == LOCAL else node1.serverIP
        RemoteFabricLink.vni += 1
        vxlan_tunnel(node1, node2, intfname1, intfname2, addr1, addr2, RemoteFabricLink.vni, local_ip,
                     self.moveIntf, self.owner)


def terminate(node) -> None:
    """Mininet's terminate, its shell's ssh client killed first when the node is on another server:
    Mininet sends SIGHUP to the shell's process group and waits for it without a timeout, but that
    ssh ignores SIGHUP and sudo only catches it (docs/platform.md): a fabric's stop waited 6 minutes."""
    if getattr(node, "isRemote", False) and node.shell is not None and node.shell.poll() is None:
        try:
            os.killpg(node.shell.pid, signal.SIGKILL)
            node.shell.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    super(type(node), node).terminate()


def kill_in_namespace(node) -> None:
    """Every process left in the network namespace of a host on another server, its shell apart: a
    process Node.popen started there runs under `ssh`, and killing that local client leaves it
    running on the server. (A switch's shell is in the server's own namespace: left alone.)"""
    if server_of(node) == LOCAL or not getattr(node, "inNamespace", False) or not node.pid:
        return
    script = (f'ns=$(readlink /proc/{node.pid}/ns/net) && for p in /proc/[0-9]*; do pid=${{p#/proc/}}; '
              f'[ "$pid" != {node.pid} ] && [ "$(readlink $p/ns/net 2>/dev/null)" = "$ns" ] && kill -9 $pid; '
              'done; true')
    node.rcmd(["sh", "-c", shlex.quote(script)])


@cache
def remote(cls: type) -> type:
    """The class of a node of ours that may live on another server."""
    if issubclass(cls, OVSUserSwitch):
        def batch_startup(switch_cls, switches, run=errRun):
            """Each server's switches by that server's ovs-vsctl: here as Mininet runs it, on another
            server through SSH as one command. Not through a node's shell: a shell reads from a
            terminal, which cuts a line at 4095 bytes, and the batch of a few switches is longer."""
            for server in sorted({switch.server for switch in switches}):
                group = [switch for switch in switches if switch.server == server]
                OVSUserSwitch.batchStartup.__func__(switch_cls, group, run=run if server == LOCAL else
                                                    functools.partial(run_over_ssh, group[0]))
            return switches
        return type(f"Remote{cls.__name__}", (RemoteMixin, cls),
                    {"batchStartup": classmethod(batch_startup), "terminate": terminate,
                     "batchShutdown": classmethod(RemoteOVSSwitch.batchShutdown.__func__)})
    return type(f"Remote{cls.__name__}", (RemoteMixin, cls), {"terminate": terminate})


def run_over_ssh(node, command: str, **_) -> str:
    """`command` (a shell command line of any length) on the server of `node`, through SSH."""
    return node.rcmd(["sh", "-c", shlex.quote(command)])


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


def remote_argv(cmd: list[str], cwd: str | os.PathLike | None) -> list[str]:
    """A host app's argv as its node's Popen takes it when the node is on another server. Mininet
    hands the words to ssh, which joins them with spaces for the server's root shell to parse again,
    and Popen's cwd moves only the local ssh client: so the whole command is one word, quoted for
    that shell, that changes to `cwd` there first."""
    inner = f"cd {shlex.quote(os.fspath(cwd))} && exec {shlex.join(cmd)}" if cwd else f"exec {shlex.join(cmd)}"
    return ["sh", "-c", shlex.quote(inner)]


def server_of(node) -> str:
    return getattr(node, "server", LOCAL)


def make_dir(node, path: str) -> None:
    """The folder a host app writes into, on the node's server too."""
    if server_of(node) != LOCAL:
        node.rcmd(f"mkdir -p {shlex.quote(path)}")


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def same_kernel(node) -> bool:
    """The node's server runs on this machine's kernel (a server emulated in a namespace,
    emulation/emulated_server.py): its clock is this machine's."""
    if server_of(node) == LOCAL:
        return True
    return node.rcmd(f"cat {BOOT_ID}").strip() == Path(BOOT_ID).read_text().strip()


def same_folder(node, path: str) -> bool:
    """The node's server sees this very folder at `path` (it shares this machine's filesystem)."""
    try:
        here = os.stat(path)
    except OSError:
        return False
    there = node.rcmd(f"cat {BOOT_ID} && stat -L -c '%d %i' {shlex.quote(path)}").split()
    return there == [Path(BOOT_ID).read_text().strip(), str(here.st_dev), str(here.st_ino)]


def fetch(node, path: str) -> str:
    """What a host app wrote on another server, copied to the same path here; '' or what failed.
    Nothing to copy when that server shares this folder (scp would copy every file onto itself)."""
    server = server_of(node)
    if server == LOCAL or same_folder(node, path):
        return ""
    copy = subprocess.run(["scp", "-q", "-r", "-o", "BatchMode=yes", f"root@{server}:{path}/.", path],
                          capture_output=True, text=True)
    said = copy.stderr.strip().splitlines()
    return f"copying {path} from {server} failed: {said[-1] if said else copy.returncode}" if copy.returncode else ""


CLOCK_SAMPLES = 5


def offset_from_samples(samples: list[tuple[float, float, float]]) -> tuple[float, float]:
    """A server's clock offset from (sent, its clock, received) triples read on this machine's clock,
    as NTP reads it: its clock minus the middle of the round trip, from the shortest round trip;
    and the half round trip, which bounds the error."""
    sent, remote_now, received = min(samples, key=lambda sample: sample[2] - sample[0])
    return remote_now - (sent + received) / 2, (received - sent) / 2


def clock_offset(node, clock: Callable[[], float] = time.time) -> tuple[float, float]:
    """How far the clock of the node's server is ahead of this machine's (seconds), and the bound
    on that figure's error: (0, 0) here and on a server sharing this machine's kernel. Host apps
    stamp their records with their server's clock. Read through the node's open shell: a new SSH
    connection (rcmd) would put its set-up, most of it before `date` runs, into the round trip."""
    if same_kernel(node):
        return 0.0, 0.0
    samples = []
    for _ in range(CLOCK_SAMPLES):
        sent = clock()
        said = node.cmd("date +%s.%N").strip()
        received = clock()
        try:
            samples.append((sent, float(said.split()[-1]), received))
        except (ValueError, IndexError):
            raise ClusterError(f"cluster: reading the clock of {server_of(node)} failed: {said!r}") from None
    return offset_from_samples(samples)


TIMESTAMPED = {"iterations.csv": ("start_s", "end_s"), "tensors.csv": ("start_s", "end_s")}


def to_local_clock(folder: Path, offset_s: float, files: dict[str, tuple[str, ...]] = TIMESTAMPED) -> None:
    """Restamp a host app's records written on a server whose clock is `offset_s` ahead: the
    runner's metrics compare times across processes (the last worker's end of an iteration, the
    straggler spread), so every record must be on this machine's clock. `files`: which files, and
    their columns of timestamps."""
    if offset_s == 0:
        return
    for name, columns in files.items():
        path = folder / name
        if not path.exists():
            continue
        with open(path, newline="") as stream:
            reader = csv.DictReader(stream)
            fields, rows = reader.fieldnames or [], list(reader)
        for row in rows:
            for column in columns:
                if row.get(column):
                    row[column] = f"{float(row[column]) - offset_s:.6f}"
        with atomic_open(path, "w", newline="") as stream:  # an interrupted restamp leaves the original
            writer = csv.DictWriter(stream, fields)
            writer.writeheader()
            writer.writerows(rows)


def kill_remote(node, marker: str) -> None:
    """Stop what is left of a host app on another server (killing its local ssh client does not):
    the processes whose command line holds `marker`, the run's random job number."""
    if server_of(node) != LOCAL:
        node.rcmd(f"pkill -f -- {shlex.quote(marker)}")
