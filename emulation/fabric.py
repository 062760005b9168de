"""The fabric: a Mininet network of one of our Topos plus our controller, started and torn down
as one unit. Tests, benchmarks and the experiment runner all use it:

    with Fabric("leafspine", {"spines": 2, "leaves": 2, "hosts": 2}, lb="spray") as fab:
        fab.wait_reachable()
        proc = fab.popen("h1", ["iperf3", "-s"])

Only one fabric runs per machine (one ovs-vswitchd, fixed switch names): a lock serializes them.
Whatever a fabric starts is recorded in a state file first, so `make clean-net`
(emulation/cleanup.py) can remove it even after this process was killed.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mininet.net import Mininet
from mininet.node import RemoteController

from common.paths import REPO, venv_python
from common.signals import signals_deferred
from emulation.cleanup import LOCK_FILE, STATE_DIR, clean_stale, process_record, write_state
from emulation.cluster import LOOPBACK, check_servers, cluster_network, controller_address, popen_options
from topologies.cluster import placement as placement_of
from topologies.leafspine import TopologyError, topos
from emulation.machine import MachineError, prepare

CONTROLLER_CHECK_TIMEOUT_S = 2.0
CONTROLLER_EXIT_WAIT_S = 0.5  # after its REST failed: a killed controller is reaped within this
_running: "Fabric | None" = None  # the fabric this process runs (the lock is per machine)


class FabricError(RuntimeError):
    """The fabric could not be built or did not come up; the message says what and why."""


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
        self.kind, self.params, self.lb = kind, dict(params or {}), lb
        self.ofp_port, self.rest_port = ofp_port, rest_port
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fabric-", dir="/var/tmp"))
        self.stats_csv, self.stats_interval = stats_csv, stats_interval
        self.lock_timeout = lock_timeout
        self.own_controller, self.known_hosts = own_controller, known_hosts
        self.servers, self.placement = servers, placement
        self.ofp_host = LOOPBACK
        if servers:
            placement_of(self.topo.layout, servers, placement)
            check_servers(servers)
            self.ofp_host = controller_address(servers)
        self.net: Mininet | None = None
        self.controller: subprocess.Popen | None = None
        self.processes: list[subprocess.Popen] = []
        self.cleaned: list[str] = []  # what start() removed of a killed fabric, for the caller to say
        self.sysctls_changed: dict[str, tuple] = {}  # machine-wide settings start() raised
        self.timings: dict[str, float] = {}  # seconds to build the network, start it (until the
        # controller knows every switch and link), and stop it
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
        try:
            self.sysctls_changed = prepare(getattr(self.topo, "tcp_cc", None))
        except MachineError as error:
            raise FabricError(str(error)) from None
        self._write_state()
        if self.own_controller:
            self._start_controller()
        options = dict(topo=self.topo, controller=None, autoSetMacs=False, autoStaticArp=False, build=False)
        if self.servers:
            self.net = cluster_network(servers=self.servers, method=self.placement, **options)
        else:
            self.net = Mininet(**options)
        self.net.addController("c0", controller=RemoteController, ip=self.ofp_host, port=self.ofp_port)
        began = time.monotonic()
        with signals_deferred():  # every node shell recorded before Ctrl-C can strike
            self.net.build()
            self._write_state()
        built = time.monotonic()
        self.net.start()
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
            self.processes.clear()
            if self.net is not None:
                net, self.net = self.net, None
                self._stop_network(net)
            if self.controller is not None:
                kill_group(self.controller)
                self.controller = None
            clean_stale()  # whatever the teardown left; forgets the state file
            self._release_lock()

    def _stop_network(self, net: Mininet) -> None:
        """Mininet's stop, unless a node's shell has exited: Mininet holds both ends of each shell's
        terminal, so it would wait forever for a dead shell to answer (a CI run hung so). The
        clean-up after it (clean_stale) removes the network then, as after a killed runner."""
        exited = [node.name for node in (*net.hosts, *net.switches, *net.controllers)
                  if node.shell is not None and node.shell.poll() is not None]
        if exited:
            print(f"fabric: the shells of {', '.join(exited)} had exited; removing the network "
                  "without Mininet", file=sys.stderr)
            return
        try:
            began = time.monotonic()
            net.stop()
            self.timings["stop_s"] = time.monotonic() - began
            for controller in net.controllers:  # RemoteController.stop leaves its shell
                controller.terminate()
        except Exception as err:  # keep tearing down; clean-up catches what is left
            print(f"fabric: mininet stop failed: {err}", file=sys.stderr)

    def _acquire_lock(self) -> None:
        global _running
        if _running is not None:
            raise FabricError("this process already runs a fabric: stop it before starting another")
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        self._lock = open(LOCK_FILE, "w")
        deadline = time.monotonic() + self.lock_timeout
        waited = False
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _running = self
                return
            except BlockingIOError:
                if not waited:
                    print(f"fabric: another fabric is running; waiting for it (at most "
                          f"{self.lock_timeout:.0f} s)", file=sys.stderr)
                    waited = True
                if time.monotonic() > deadline:
                    raise FabricError("another fabric is running on this machine (lock "
                                      f"{LOCK_FILE}); wait for it or run `make clean-net`")
                time.sleep(0.5)

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
        if self.controller is not None:
            pids.append(self.controller.pid)
        if self.net is not None:  # every node's shell: hosts, switches, the controller's
            pids += [node.pid for node in (*self.net.hosts, *self.net.switches, *self.net.controllers)
                     if getattr(node, "pid", None)]
        records = [record for record in map(process_record, pids) if record is not None]
        write_state({"owner": process_record(os.getpid()), "processes": records,
                     "switches": list(self.topo.switches())})

    def _start_controller(self) -> None:
        cmd = [venv_python(), "-m", "controller", "--lb", self.lb,
               "--ofp-host", self.ofp_host, "--ofp-port", str(self.ofp_port), "--rest-port", str(self.rest_port),
               "--log-file", str(self.controller_log), "--stats-interval", str(self.stats_interval)]
        if self.known_hosts:
            hosts_file = self.workdir / "hosts.json"
            hosts_file.write_text(json.dumps(topo_hosts(self.topo)))  # read only by the controller it starts
            cmd += ["--hosts-file", str(hosts_file)]
        if self.stats_csv:
            cmd += ["--stats-csv", str(self.stats_csv)]
        err = open(self.workdir / "controller.stderr", "a")
        with signals_deferred():  # recorded before Ctrl-C can strike, or stop() would not know it
            self.controller = subprocess.Popen(cmd, cwd=REPO, stdout=err, stderr=subprocess.STDOUT,
                                               start_new_session=True)
            self._write_state()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.controller.poll() is not None:
                raise FabricError("controller exited: " +
                                  (self.workdir / "controller.stderr").read_text().strip()[-500:])
            try:
                self.rest("/fabric")
                return
            except OSError:
                time.sleep(0.2)
        raise FabricError(f"controller REST did not answer on 127.0.0.1:{self.rest_port} in 20 s")

    @property
    def controller_log(self) -> Path:
        return self.workdir / "controller.log"

    def controller_down(self) -> str:
        """Why our controller is not serving ('' while it is): it exited, or its REST is silent."""
        if self.controller is None:
            return ""
        status = self.controller.poll()
        if status is None:
            try:
                self.rest("/fabric", timeout=CONTROLLER_CHECK_TIMEOUT_S)
                return ""
            except OSError as error:
                try:  # a reset or refused connection: the process may be dying, and its status says more
                    status = self.controller.wait(CONTROLLER_EXIT_WAIT_S)
                except subprocess.TimeoutExpired:
                    return f"controller REST did not answer ({error})"
        return f"controller exited with status {status}"

    def restart_controller(self, jobs: list[dict], timeout: float = 30.0) -> None:
        """Replace a dead or silent controller on the running fabric: a new one with the same ports,
        the fabric's hosts known in advance, then `jobs` registered again; returns once every
        switch has reconnected with the same flow tables as before the fault (or FabricError)."""
        before = self.flow_tables()
        kill_group(self.controller)
        self._start_controller()
        for job in jobs:
            self.rest("/jobs", "POST", job)
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

    # -- readiness ----------------------------------------------------------------------------
    def wait_fabric(self, timeout: float = 30.0) -> None:
        """Wait until the controller knows every switch and every switch-to-switch link."""
        switches = set(self.topo.switches())
        want_links = sum(1 for a, b in self.topo.links() if a in switches and b in switches)
        deadline = time.monotonic() + timeout
        seen = {}
        while time.monotonic() < deadline:
            seen = self.rest("/fabric")
            if len(seen["switches"]) == len(switches) and len(seen["links"]) == want_links:
                return
            time.sleep(0.2)
        raise FabricError(f"controller saw {len(seen.get('switches', []))}/{len(switches)} "
                          f"switches and {len(seen.get('links', []))}/{want_links} links "
                          f"after {timeout:.0f} s (log: {self.controller_log})")

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
        with signals_deferred():  # recorded before Ctrl-C can strike, or stop() would not know it
            proc = node.popen(cmd, **popen_options(node), **kwargs)
            self.processes.append(proc)
            self._write_state()
        return proc

    def rest(self, path: str, method: str = "GET", body: dict | None = None,
             timeout: float = 5.0) -> dict | list:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.rest_port}{path}", data=data,
                                     method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def controller_problems(self) -> list[str]:
        """Exceptions and OpenFlow errors in the controller log (there must be none)."""
        if not self.controller_log.exists():
            return []
        return [line for line in self.controller_log.read_text().splitlines()
                if "Traceback" in line or "OpenFlow error" in line or "Exception" in line]

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


def kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `grace` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
