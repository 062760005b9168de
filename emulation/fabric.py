"""The fabric: a Mininet network of one of our Topos plus its controller (emulation/controller.py),
started and torn down as one unit. Tests, benchmarks and the experiment runner all use it:

    with Fabric("leafspine", {"spines": 2, "leaves": 2, "hosts_per_leaf": 2}, lb="spray") as fab:
        fab.wait_reachable()
        proc = fab.popen("h1", ["iperf3", "-s"])
        fault = fab.check()  # every second or so: raises FabricError once the network is broken

Only one fabric runs per machine (one ovs-vswitchd, fixed switch names): a lock serializes them.
Whatever a fabric starts is recorded in a state file first, and whatever it creates carries its id
(topologies/marks.py), so `make clean-net` (emulation/cleanup.py) can remove it even after this
process was killed, and nothing else. A network of the same names that is not a fabric's (one
built by hand with `mn`) makes start() refuse: building over it would tear it down.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mininet.net import Mininet

from common.signals import signals_deferred
from emulation.cleanup import (LOCK_FILE, STATE_DIR, FabricRecord, clean_stale, kill_group, marked_bridges,
                               process_record, write_state)
from emulation.cluster import (LOOPBACK, cluster_network, controller_address, kill_in_namespace,
                               popen_options, remote_argv, server_of)
from emulation.controller import ControllerProcess, rest
from emulation.errors import FabricError
from emulation.machine import MachineError, prepare, vswitchd_pid
from emulation.preflight import check_servers
from topologies.cluster import LOCAL
from topologies.cluster import placement as placement_of
from topologies.leafspine import TopologyError, topos
from topologies.marks import fabric_owner
from topologies.nodes import FabricController, ShapedIntf

__all__ = ["Fabric", "FabricError", "kill_group", "topo_hosts"]

OVS_TIMEOUT_S = 2  # an ovs-vsctl call of check(): OVS answers in milliseconds when it runs
VSWITCHD_RETURN_S = 30.0  # how long check() waits for a restarting Open vSwitch (it reports connections every 5 s)
_running: "Fabric | None" = None  # the fabric this process runs (the lock is per machine)


class Fabric:
    def __init__(self, kind: str = "leafspine", params: dict | None = None, lb: str = "ecmp",
                 ofp_port: int = 6653, rest_port: int = 8080, workdir: str | Path | None = None,
                 stats_csv: str | Path | None = None, stats_interval: float = 1.0,
                 lock_timeout: float = 600.0, own_controller: bool = True,
                 known_hosts: bool = True, servers: list[str] | None = None,
                 placement: str = "switchbin") -> None:
        """own_controller=False: use a controller already listening on ofp_port/rest_port
        (and leave it running), as a user re-running `mn` against one controller does.
        known_hosts: our controller is told every host in advance (routes exist from the start,
        and again right after a restart); False: it learns them from ARP, as with plain `mn`.
        servers: run the fabric across these machines through Mininet Cluster Edition
        (topologies/cluster.py), its nodes placed by `placement`; None: this machine alone.
        A server that cannot be reached or a placement that cannot fit raise ClusterError here,
        before anything is started."""
        if kind not in topos:
            raise TopologyError(f"kind: {kind!r} is not allowed (one of {', '.join(topos)})")
        self.topo = topos[kind](**(params or {}))  # validates the parameters
        self.id = secrets.token_hex(4)
        self.topo.claim(fabric_owner(self.id))
        self.kind, self.params, self.lb = kind, dict(params or {}), lb
        self.ofp_port, self.rest_port = ofp_port, rest_port
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fabric-", dir="/var/tmp"))
        self.lock_timeout = lock_timeout
        self.servers, self.placement = servers, placement
        self.ofp_host = LOOPBACK
        if servers:
            placement_of(self.topo.layout, servers, placement)
            check_servers(servers, self.topo.mtu)
            self.ofp_host = controller_address(servers)
        self.controller = ControllerProcess(lb, self.workdir, self.ofp_host, ofp_port, rest_port, stats_csv,
                                            stats_interval, topo_hosts(self.topo) if known_hosts else None,
                                            own=own_controller, on_started=self._write_state)
        self.net: Mininet | None = None
        self.processes: list[subprocess.Popen] = []
        self.cleaned: list[str] = []  # what start() removed of a killed fabric, for the caller to say
        self.sysctls_changed: dict[str, tuple] = {}  # machine-wide settings start() raised
        self.timings: dict[str, float] = {}  # seconds to build the network, start it (until the
        # controller knows every switch and link), and stop it
        self.vswitchd: int | None = None  # the ovs-vswitchd the switches run in
        self._lock = None

    # -- life cycle ---------------------------------------------------------------------------
    def __enter__(self) -> "Fabric":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise FabricError("the fabric needs root (Mininet, Open vSwitch): run with sudo")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._acquire_lock()
        # A previous fabric that was killed: its lock is free, its leftovers not.
        self.cleaned = clean_stale()
        self._refuse_clashes()
        try:
            self.sysctls_changed = prepare(getattr(self.topo, "tcp_cc", None))
        except MachineError as error:
            raise FabricError(str(error)) from None
        self._write_state()
        self.controller.start()
        options = dict(topo=self.topo, controller=None, autoSetMacs=False, autoStaticArp=False, build=False)
        if self.servers:
            self.net = cluster_network(servers=self.servers, method=self.placement, **options)
        else:
            self.net = Mininet(**options)
        self.net.addController("c0", controller=FabricController, ip=self.ofp_host, port=self.ofp_port)
        began = time.monotonic()
        with signals_deferred():  # every node shell recorded before Ctrl-C can strike
            self.net.build()
            self._write_state()
        built = time.monotonic()
        self.net.start()
        self.vswitchd = vswitchd_pid()
        self.wait_fabric()
        self.timings = {"build_s": built - began, "start_s": time.monotonic() - built}

    def stop(self) -> None:
        """Tear down everything this fabric started; safe to call twice or after a failure. Ctrl-C
        and SIGTERM wait until it is done (an interrupted Mininet stop left bridges behind)."""
        if self._lock is None:
            return  # never started, or stopped already
        with signals_deferred():
            for proc in self.processes:
                kill_group(proc)
            if self.processes and self.net is not None and self.servers:
                for host in self.net.hosts:  # what they started on other servers (kill_group reached ssh)
                    kill_in_namespace(host)
            self.processes.clear()
            if self.net is not None:
                net, self.net = self.net, None
                self._stop_network(net)
            self.controller.stop()
            clean_stale()  # whatever the teardown left; forgets the state file
            self._release_lock()

    def _stop_network(self, net: Mininet) -> None:
        """Mininet's stop, unless a node's shell has exited or ovs-vswitchd is not running: Mininet
        holds both ends of each shell's terminal, so it would wait forever for a dead shell to answer
        (a CI run hung so), and its ovs-vsctl calls would wait for ovs-vswitchd to apply them. The
        clean-up after it (clean_stale) removes the network then, as after a killed runner."""
        exited = self._exited_shells(net)
        if exited:
            print(f"fabric: the shells of {', '.join(exited)} had exited; removing the network "
                  "without Mininet", file=sys.stderr)
            return
        if vswitchd_pid() is None:
            print("fabric: ovs-vswitchd is not running; removing the network without Mininet", file=sys.stderr)
            return
        try:
            began = time.monotonic()
            net.stop()
            self.timings["stop_s"] = time.monotonic() - began
            for controller in net.controllers:  # RemoteController.stop leaves its shell
                controller.terminate()
        except Exception as err:  # keep tearing down; clean-up catches what is left
            print(f"fabric: mininet stop failed: {err}", file=sys.stderr)

    @staticmethod
    def _exited_shells(net: Mininet) -> list[str]:
        """The nodes whose shell is gone. A node of Mininet's cluster classes starts its shell through
        `mnexec -d`, whose Popen exits at once: its shell is its pid, checked on this machine only."""
        exited = []
        for node in (*net.hosts, *net.switches, *net.controllers):
            if server_of(node) != LOCAL or node.shell is None:
                continue
            if popen_options(node):  # a cluster node: the shell forked away from its Popen
                if node.pid and not os.path.exists(f"/proc/{node.pid}"):
                    exited.append(node.name)
            elif node.shell.poll() is not None:
                exited.append(node.name)
        return exited

    def _refuse_clashes(self) -> None:
        """FabricError when bridges or interfaces of this fabric's names exist after clean-up: they
        belong to a network that is not a fabric's, which Mininet would tear down (it deletes a
        bridge of the name it adds, and its interfaces with the switch)."""
        switches = set(self.topo.switches())
        names = switches | {self.topo.layout.interface(node.name, port) for node in self.topo.layout.switches
                            for port in self.topo.layout.ports(node.name)}
        bridges = set(subprocess.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S}", "list-br"], capture_output=True,
                                     text=True).stdout.split())
        links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout or "[]")
        taken = sorted((bridges & switches) | ({link["ifname"] for link in links} & names))
        if not taken:
            return
        shown = ", ".join(taken[:4]) + (f" and {len(taken) - 4} more" if len(taken) > 4 else "")
        if any(name in switches for name in marked_bridges()):  # our mark, no fabric's: hand-run (or older)
            raise FabricError(f"{shown} already exist, of a network built by hand with our Topo (mn): this fabric "
                              "would tear it down; stop that network first (a dead one: `python -m "
                              "emulation.cleanup --hand-run`)")
        raise FabricError(f"{shown} already exist, of a network that is not the testbed's: this fabric would "
                          "tear it down; stop that network first")

    def _acquire_lock(self) -> None:
        global _running
        if _running is not None:
            raise FabricError("this process already runs a fabric: stop it before starting another")
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        # Held in self._lock only once taken: stop() clears what the state file records, which is the
        # running fabric's until this one has the lock.
        lock = open(LOCK_FILE, "w")
        deadline = time.monotonic() + self.lock_timeout
        waited = False
        try:
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._lock, _running = lock, self
                    return
                except BlockingIOError:
                    if not waited:
                        print(f"fabric: another fabric is running; waiting for it (at most "
                              f"{self.lock_timeout:.0f} s)", file=sys.stderr)
                        waited = True
                    if time.monotonic() > deadline:
                        raise FabricError("another fabric is running on this machine (lock "
                                          f"{LOCK_FILE}); wait for it or run `make clean-net`") from None
                    time.sleep(0.5)
        except BaseException:
            lock.close()
            raise

    def _release_lock(self) -> None:
        global _running
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        if _running is self:
            _running = None

    def _write_state(self) -> None:
        """Record what we started (with each process's start time, so that clean-up after a crash
        signals only those very processes), dropping what has ended."""
        self.processes = [proc for proc in self.processes if proc.poll() is None]
        pids = [proc.pid for proc in self.processes]
        if self.controller.pid is not None:
            pids.append(self.controller.pid)
        if self.net is not None:  # every node's shell: hosts, switches, the controller's
            pids += [node.pid for node in (*self.net.hosts, *self.net.switches, *self.net.controllers)
                     if getattr(node, "pid", None)]
        records = [record for record in map(process_record, pids) if record is not None]
        write_state(FabricRecord(fabric=self.id, owner=process_record(os.getpid()), processes=records,
                                 switches=list(self.topo.switches())))

    # -- the controller -----------------------------------------------------------------------
    @property
    def controller_log(self) -> Path:
        return self.controller.log

    def controller_down(self) -> str:
        """Why our controller is not serving ('' while it is): it exited, or its REST is silent."""
        return self.controller.down()

    def controller_problems(self) -> list[str]:
        """Exceptions and OpenFlow errors in the controller log (there must be none)."""
        return self.controller.problems()

    def restart_controller(self, jobs: list[dict], timeout: float = 30.0) -> None:
        """Replace a dead or silent controller on the running fabric: a new one with the same ports,
        the fabric's hosts known in advance, then `jobs` registered again; returns once every
        switch has reconnected with the same flow tables as before the fault (or FabricError)."""
        before = self.flow_tables()
        self.controller.restart(jobs)
        self.wait_fabric(timeout)
        deadline = time.monotonic() + timeout
        while (tables := self.flow_tables()) != before:
            if time.monotonic() > deadline:
                differ = sorted(name for name in tables if tables[name] != before.get(name))
                first = differ[0]
                lost = sorted(set(before.get(first, [])) - set(tables[first]))
                new = sorted(set(tables[first]) - set(before.get(first, [])))
                raise FabricError(f"after a controller restart the flow tables of {', '.join(differ)} "
                                  f"differ from before after {timeout:.0f} s ({first}: lost {lost[:3]}, "
                                  f"new {new[:3]})")
            time.sleep(0.2)

    def rest(self, path: str, method: str = "GET", body: dict | None = None,
             timeout: float = 5.0) -> dict | list:
        return rest(self.rest_port, path, method, body, timeout)

    def flow_tables(self) -> dict[str, list[str]]:
        """Every switch's flows and groups (no counters), sorted: what the controller installed."""
        tables = {}
        for switch in self.topo.switches():
            lines = []
            for what in ("dump-flows", "dump-groups"):
                out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "--no-stats", what, switch],
                                     capture_output=True, text=True).stdout
                lines += [line.strip() for line in out.splitlines()[1:]]
            tables[switch] = sorted(lines)
        return tables

    # -- readiness and health -----------------------------------------------------------------
    def wait_fabric(self, timeout: float = 30.0) -> None:
        """Wait until the controller knows every switch and every switch-to-switch link."""
        switches = set(self.topo.switches())
        links = sum(1 for a, b in self.topo.links() if a in switches and b in switches)
        self.controller.wait_switches(len(switches), links, timeout)

    def wait_reachable(self, timeout: float = 60.0) -> None:
        """Wait until every host reaches every other (the controller learns hosts from ARP)."""
        deadline = time.monotonic() + timeout
        while True:
            loss = self.net.pingAll(timeout=1)
            if loss == 0:
                return
            if time.monotonic() > deadline:
                raise FabricError(f"hosts still unreachable after {timeout:.0f} s "
                                  f"({loss:.0f}% ping loss; log: {self.controller_log})")

    def local_switches(self) -> list:
        """The switches of this machine's ovs-vswitchd (in a cluster, the others run elsewhere)."""
        return [switch for switch in self.net.switches if server_of(switch) == LOCAL]

    def missing_interfaces(self) -> list[str]:
        """The bridges and ports of this machine's switches that OVS does not hold, or whose device is
        gone from the kernel (OVS keeps a port whose veth was deleted, down, as it keeps one a link
        fault set down). One ovs-vsctl call; FabricError when OVS does not answer."""
        out = subprocess.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S}", "--format=json", "--columns=name,ofport",
                              "list", "Interface"], capture_output=True, text=True)
        if out.returncode != 0:
            raise FabricError(f"Open vSwitch does not answer ({out.stderr.strip()[-200:]})")
        held = {name for name, ofport in json.loads(out.stdout)["data"] if isinstance(ofport, int) and ofport > 0}
        wanted = set()
        for switch in self.local_switches():
            wanted |= {switch.name} | {intf.name for intf in switch.intfList() if intf.name != "lo"}
        return sorted(name for name in wanted if name not in held or not os.path.exists(f"/sys/class/net/{name}"))

    def unconnected_switches(self) -> list[str]:
        """This machine's switches whose OpenFlow connection to the controller is down, as OVS sees it."""
        return [switch.name for switch in self.local_switches() if not switch.connected()]

    def check(self) -> str:
        """Cheap enough to call every second while the fabric runs. '' while the network is whole;
        a line describing a fault it repaired (ovs-vswitchd restarted: its ports back, shaped
        again, the switches reconnected); FabricError when the network is broken (a node's shell
        exited, bridges or ports gone: another tool such as `mn -c` tore it down)."""
        if self.net is None:
            raise FabricError("the fabric is not running")
        exited = self._exited_shells(self.net)
        if exited:
            raise FabricError(f"the shells of {', '.join(exited[:6])}{' ...' if len(exited) > 6 else ''} "
                              "exited (the network was torn down by another tool, e.g. mn -c?)")
        pid = vswitchd_pid()
        if pid is not None and pid == self.vswitchd:
            try:
                missing = self.missing_interfaces()
            except FabricError:  # ovsdb-server restarting: wait for it below
                return self._recover()
            if missing:
                raise FabricError(f"Open vSwitch lost {len(missing)} of the fabric's bridges and ports "
                                  f"({', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}): "
                                  "deleted by another tool (mn -c, ovs-vsctl)?")
            return ""
        return self._recover()

    def _recover(self) -> str:
        """Open vSwitch restarted, or is restarting (`ovs-ctl restart`: ovsdb-server, then ovs-vswitchd,
        which restores the saved flows before it connects to controllers): wait until it answers
        with every port of the network working and its flows restored; when ovs-vswitchd is a new
        one, wait for every switch to reconnect to the controller, then shape the ports again (OVS
        resets the root qdisc of a port it adds, and again when the flow restore ends). FabricError
        when that takes more than VSWITCHD_RETURN_S."""
        began = time.monotonic()
        deadline = began + VSWITCHD_RETURN_S
        while missing := self._unsettled() if (pid := vswitchd_pid()) is not None else ["ovs-vswitchd"]:
            if time.monotonic() > deadline:
                raise FabricError(f"Open vSwitch stopped (ovs-vswitchd pid {self.vswitchd}) and did not come back "
                                  f"with the fabric in {VSWITCHD_RETURN_S:.0f} s (missing: {', '.join(missing[:6])})")
            time.sleep(0.2)
        if pid == self.vswitchd:
            return ""  # only ovsdb-server restarted: the switches kept running
        while unconnected := self.unconnected_switches():
            if time.monotonic() > deadline:
                raise FabricError(f"ovs-vswitchd restarted and {', '.join(unconnected)} did not reconnect to the "
                                  f"controller in {VSWITCHD_RETURN_S:.0f} s")
            time.sleep(0.2)
        self._reshape(deadline)
        self.wait_fabric(max(1.0, deadline - time.monotonic()))
        before, self.vswitchd = self.vswitchd, pid
        return (f"ovs-vswitchd restarted (pid {before} -> {pid}); ports back and shaped again, switches "
                f"reconnected in {time.monotonic() - began:.1f} s")

    def _unsettled(self) -> list[str]:
        """What Open vSwitch still lacks after a restart: the network's missing ports, or the flow
        restore it is waiting for; ['ovsdb-server'] while that does not answer."""
        try:
            missing = self.missing_interfaces()
        except FabricError:
            return ["ovsdb-server"]
        restoring = subprocess.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S}", "--if-exists", "get", "Open_vSwitch",
                                    ".", "other_config:flow-restore-wait"], capture_output=True, text=True)
        return missing + (["the flow restore"] if restoring.returncode or "true" in restoring.stdout else [])

    def shaped_ports(self) -> list:
        """This machine's switch ports that carry the priority tree (topologies/nodes.py ShapedIntf)."""
        return [intf for switch in self.local_switches() for intf in switch.intfList()
                if isinstance(intf, ShapedIntf) and intf.bw is not None]

    def unshaped_ports(self) -> list:
        """The shaped switch ports whose root qdisc is not the priority tree's HTB (one tc call)."""
        listing = subprocess.run(["tc", "-j", "qdisc", "show"], capture_output=True, text=True).stdout
        qdiscs = json.loads(listing or "[]")
        trees = {qdisc["dev"] for qdisc in qdiscs if qdisc.get("root") and qdisc["kind"] == "htb"}
        return [intf for intf in self.shaped_ports() if intf.name not in trees]

    def _reshape(self, deadline: float) -> None:
        """Shape the ports of a restarted ovs-vswitchd again, until their trees stay put for a
        moment (a tree set while OVS resets the port fails, or is reset)."""
        error, kept = "", 0
        while kept < 2:
            unshaped = self.unshaped_ports()
            kept = 0 if unshaped else kept + 1
            if unshaped and time.monotonic() > deadline:
                raise FabricError(f"ovs-vswitchd restarted and shaping {', '.join(map(str, unshaped[:4]))} again "
                                  f"failed ({error or 'its tree was reset'})")
            for intf in unshaped:
                try:
                    intf.shape()
                except RuntimeError as failure:
                    error = str(failure).splitlines()[0]
            time.sleep(0.3)

    # -- using it -----------------------------------------------------------------------------
    def host(self, name: str):
        return self.net.get(name)

    @property
    def hosts(self) -> list:
        return self.net.hosts

    def popen(self, host: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start a process inside a host; it is killed when the fabric stops. (Mininet's
        `mnexec -d` makes it a session leader; do not pass start_new_session: mnexec then forks
        and the Popen would only see the parent exit at once.)"""
        node = self.host(host)
        if server_of(node) != LOCAL:
            cmd = remote_argv(cmd, kwargs.pop("cwd", None))
        with signals_deferred():  # recorded before Ctrl-C can strike, or stop() would not know it
            proc = node.popen(cmd, **popen_options(node), **kwargs)
            self.processes.append(proc)
            self._write_state()
        return proc

    def set_link(self, a: str, b: str, up: bool) -> None:
        self.net.configLinkStatus(a, b, "up" if up else "down")


def topo_hosts(topo) -> list[dict]:
    """The hosts of a Topo as the controller's hosts file lists them: ip, mac, and the DPID and
    port of the switch port each attaches to."""
    switches = set(topo.switches())
    hosts = []
    for _, _, link in topo.links(withInfo=True):
        for host, switch, port in ((link["node1"], link["node2"], link["port2"]),
                                   (link["node2"], link["node1"], link["port1"])):
            if host not in switches and switch in switches:
                info = topo.nodeInfo(host)
                hosts.append({"ip": info["ip"].split("/")[0], "mac": info["mac"],
                              "dpid": int(topo.nodeInfo(switch)["dpid"], 16), "port": port})
    return hosts
