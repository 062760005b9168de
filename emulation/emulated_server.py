"""A second server on this machine, for a fabric across servers (docs/cluster.md) tested without a
second machine: a network namespace joined to this one by an underlay veth sized for VXLAN, with
its own sshd on the underlay address and its own Open vSwitch (ovsdb-server and ovs-vswitchd, their
database, run and log directories). The runner reaches it as it reaches a real server: root over
SSH, `cluster: {servers: [localhost, <address>]}`.

Why a namespace and a mount namespace:
- a userspace ovs-vswitchd's datapath tap is always called `ovs-netdev`, so a second daemon can only
  start in a network namespace of its own (docs/platform.md), and its switches' ports must live
  there (AF_PACKET binds in the daemon's namespace);
- the namespaces share the filesystem, so the server's OVS tools and daemons must not find this
  machine's `/run/openvswitch`. sshd runs in a private mount namespace (`unshare --mount`) where
  this server's own directories are bind-mounted over /run/openvswitch, /etc/openvswitch and
  /var/log/openvswitch: every session (Mininet's node shells, its `ovs-vsctl` calls, the host apps)
  and the daemons started from one see the standard paths, as on a real machine, so Mininet, the
  project's code (emulation/machine.py reads the standard pidfile) and `ovs-ctl` itself run there
  unchanged. OVS_RUNDIR in the sessions' environment would redirect the OVS tools only, not
  the paths this project's code and ovs-ctl's database and log use.

The client side is one file of its own, /etc/ssh/ssh_config.d/dnn-testbed-<name>.conf (Debian's
ssh_config includes that folder): for the server's address only, this server's client key and
known-hosts file, so neither root's keys nor ~/.ssh are read or written.

Ownership: everything lives under SERVERS_DIR/<name> plus the namespace, the underlay veth and the
client config file; every process started through the server (sshd, its sessions, the node shells,
the host apps, the OVS daemons) sees the server's run directory bind-mounted over /run/openvswitch
(in its mount namespace, or in one a Mininet host made from it), which is how stop() tells them
apart from every other process of the machine. start() is idempotent; stop() removes exactly that.

    python -m emulation.emulated_server start [--name srv2]   # prints the address for cluster.servers
    python -m emulation.emulated_server stop  [--name srv2]
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.frames import DEFAULT_MTU
from common.paths import REPO
from emulation.cleanup import STATE_DIR, process_record
from emulation.cluster import VXLAN_OVERHEAD

SERVERS_DIR = STATE_DIR / "servers"
SSH_CONFIG_DIR = Path("/etc/ssh/ssh_config.d")
SSHD = "/usr/sbin/sshd"
SSHD_PRIVSEP_DIR = Path("/run/sshd")  # compiled into Debian's sshd; the openssh-server package's own
OVS_DIRS = {"run": "/run/openvswitch", "etc": "/etc/openvswitch", "log": "/var/log/openvswitch"}
NAME = re.compile(r"[a-z][a-z0-9]{0,7}")  # the namespace is dnnt-<name>, the veth dnnt-<name> (<= 15 chars)
DEFAULT_NAME = "srv2"
DEFAULT_SUBNET = "10.251.0.0/30"  # this machine .1, the server .2
UNDERLAY_MTU = DEFAULT_MTU + VXLAN_OVERHEAD
READY_S = 20.0
TERM_GRACE_S = 3.0


class ServerError(RuntimeError):
    """The emulated server could not be started or stopped; the message says which step."""


@dataclass
class ServerState:
    """What start() made, recorded before each step so that stop() can undo a half-done start."""
    name: str
    subnet: str
    namespace: str
    veth: str
    local_ip: str
    server_ip: str
    mtu: int
    directory: str
    ssh_config: str
    privsep_dir_made: bool = False
    sshd: dict | None = None  # ProcessRecord of the listening sshd
    mount_ns: str = ""  # readlink of its /proc/<pid>/ns/mnt: every process started through the server
    ovs: dict[str, dict] = field(default_factory=dict)  # daemon -> ProcessRecord, for the report only

    @classmethod
    def plan(cls, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET, mtu: int = UNDERLAY_MTU) -> "ServerState":
        if not NAME.fullmatch(name):
            raise ServerError(f"name: {name!r} is not allowed (a lower-case letter, then up to 7 letters or digits)")
        try:
            network = ipaddress.ip_network(subnet)
        except ValueError:
            raise ServerError(f"subnet: {subnet!r} is not an IPv4 network") from None
        if network.version != 4 or network.num_addresses < 4:
            raise ServerError(f"subnet: {subnet!r} must be an IPv4 network of at least 4 addresses (a /30)")
        local_ip, server_ip = (str(address) for address in list(network.hosts())[:2])
        directory = SERVERS_DIR / name
        return cls(name=name, subnet=str(network), namespace=f"dnnt-{name}", veth=f"dnnt-{name}",
                   local_ip=local_ip, server_ip=server_ip, mtu=mtu, directory=str(directory),
                   ssh_config=str(SSH_CONFIG_DIR / f"dnn-testbed-{name}.conf"))

    # -- files ---------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.directory)

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def key(self, name: str) -> Path:
        return self.dir / "ssh" / name

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        temporary = self.state_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self), indent=1))
        temporary.replace(self.state_file)

    @classmethod
    def load(cls, name: str) -> "ServerState | None":
        try:
            return cls(**json.loads((SERVERS_DIR / name / "state.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None


def sh(*argv: str, check: str = "", **kwargs) -> subprocess.CompletedProcess:
    """Run a command; with `check`, a failure is a ServerError naming that step and what it said."""
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ServerError(f"{check} failed: {said[-1] if said else f'exit status {done.returncode}'}")
    return done


def sshd_config(state: ServerState) -> str:
    """The server's sshd: root by key only, on the underlay address only, this server's files only.
    MaxStartups/MaxSessions: Mininet opens an SSH connection per remote node's shell and per command
    it runs on the server, many at once while a network is built."""
    return "\n".join([
        f"ListenAddress {state.server_ip}", "Port 22",
        f"HostKey {state.key('host_ed25519')}",
        f"AuthorizedKeysFile {state.key('authorized_keys')}",
        f"PidFile {state.dir / 'sshd.pid'}",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "UseDNS no", "PrintMotd no",
        "MaxStartups 200:30:400", "MaxSessions 200",
        "Subsystem sftp /usr/lib/openssh/sftp-server", "LogLevel ERROR", ""])


def ssh_client_config(state: ServerState) -> str:
    """For this server's address only: its client key and known host, nothing from ~/.ssh. Mininet
    keeps a shell per node open over ssh and waits on it without a timeout, so a server that is gone
    must end the connection (refused within ConnectTimeout, silent for 3 keep-alives of 10 s)."""
    return "\n".join([
        f"# dnn-testbed emulated server {state.name} (python -m emulation.emulated_server stop --name {state.name} "
        "removes this file)",
        f"Host {state.server_ip}",
        f"    IdentityFile {state.key('client_ed25519')}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {state.key('known_hosts')}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    ConnectTimeout 10",
        "    ServerAliveInterval 10",
        "    ServerAliveCountMax 3",
        "    ForwardAgent no", ""])


def holder_command(state: ServerState) -> list[str]:
    """sshd in the server's network namespace and a private mount namespace holding its OVS dirs."""
    mounts = " && ".join(f"mount --bind {state.dir / 'ovs' / key} {path}" for key, path in OVS_DIRS.items())
    return ["ip", "netns", "exec", state.namespace, "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", f"{mounts} && exec {SSHD} -D -f {state.dir / 'sshd_config'} -E {state.dir / 'sshd.log'}"]


def alive(record: dict | None) -> bool:
    """The process a record names still runs (the same process: same start time)."""
    if not record:
        return False
    now = process_record(record["pid"])
    return now is not None and now.start == record["start"]


def mount_ns_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return ""


def carries_our_mount(pid: int, run_dir: str) -> bool:
    """Process `pid` sees `run_dir` bind-mounted over /run/openvswitch: it runs in the server's mount
    namespace or in one made from it (a Mininet host's shell, `mnexec -n`, makes a mount namespace
    of its own, and the processes started in that host inherit it)."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split()  # id parent major:minor root mount-point ...: root is the bound folder
        if len(fields) > 4 and fields[4] == OVS_DIRS["run"] and run_dir.endswith(fields[3]) and fields[3] != "/":
            return True
    return False


def processes_of(state: ServerState) -> list[int]:
    """Every process started through the server: sshd, its sessions, the node shells and what runs in
    the hosts, the OVS daemons."""
    run_dir = str(state.dir / "ovs" / "run")
    return [int(proc.name) for proc in Path("/proc").iterdir()
            if proc.name.isdigit() and int(proc.name) != os.getpid() and carries_our_mount(int(proc.name), run_dir)]


def other_sshd_running() -> bool:
    """An sshd runs on the machine (a zombie of ours, killed and not yet reaped, does not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        if comm.split("(", 1)[-1] == "sshd" and rest.split()[0] != "Z":
            return True
    return False


def ssh_argv(state: ServerState, command: str) -> list[str]:
    return ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{state.server_ip}", command]


def answers(state: ServerState) -> bool:
    return sh(*ssh_argv(state, "true"), timeout=15).returncode == 0


def status(name: str = DEFAULT_NAME) -> ServerState | None:
    """The running server of this name (its sshd alive and answering root over SSH), else None."""
    state = ServerState.load(name)
    if state is None or not alive(state.sshd) or not answers(state):
        return None
    return state


def vswitchd_pid_at(address: str) -> int | None:
    """The ovs-vswitchd of the emulated server reached at `address` (None: no such server here, or
    its daemon is not running): it runs on this machine, so its CPU can be read here."""
    for state_file in SERVERS_DIR.glob("*/state.json"):
        state = ServerState.load(state_file.parent.name)
        if state is not None and state.server_ip == address:
            try:
                pid = int((state.dir / "ovs" / "run" / "ovs-vswitchd.pid").read_text())
            except (OSError, ValueError):
                return None
            return pid if mount_ns_of(pid) == state.mount_ns else None
    return None


def start(name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET, mtu: int = UNDERLAY_MTU,
          say=lambda line: print(line, file=sys.stderr)) -> ServerState:
    """The emulated server `name`, running: returned as it is when it already runs; what a
    previous start left half done is removed first. ServerError naming the step that failed, with
    whatever this start made removed again."""
    if os.geteuid() != 0:
        raise ServerError("the emulated server needs root (namespaces, sshd, Open vSwitch)")
    running = status(name)
    if running is not None:
        if (running.subnet, running.mtu) != (str(ipaddress.ip_network(subnet)), mtu):
            raise ServerError(f"{name} already runs on {running.subnet} with MTU {running.mtu}: stop it first")
        return running
    if ServerState.load(name) is not None or (SERVERS_DIR / name).exists():
        say(f"emulated server {name}: removing what an earlier start left")
        stop(name, say=say)
    state = ServerState.plan(name, subnet, mtu)
    for tool in (SSHD, "ssh-keygen", "unshare"):
        if shutil.which(tool) is None:
            raise ServerError(f"{tool} is not installed (make setup-server installs openssh-server)")
    _refuse_taken(state)
    try:
        _make(state, say)
    except BaseException:
        stop(name, say=say)
        raise
    return state


def _refuse_taken(state: ServerState) -> None:
    """ServerError when the namespace, the veth or an address of the subnet is someone else's."""
    if state.namespace in sh("ip", "netns", "list").stdout.split():
        raise ServerError(f"network namespace {state.namespace} exists and is not this server's (no state in "
                          f"{state.directory}): remove it or pick another --name")
    links = json.loads(sh("ip", "-j", "link", "show").stdout or "[]")
    if any(link["ifname"] == state.veth for link in links):
        raise ServerError(f"interface {state.veth} exists and is not this server's: pick another --name")
    network = ipaddress.ip_network(state.subnet)
    for link in json.loads(sh("ip", "-j", "addr", "show").stdout or "[]"):
        for address in link.get("addr_info", []):
            if address.get("family") == "inet" and ipaddress.ip_address(address["local"]) in network:
                raise ServerError(f"subnet: {state.subnet} is in use on {link['ifname']} ({address['local']}): "
                                  "pick another --subnet")


def _make(state: ServerState, say) -> None:
    state.save()
    for key in OVS_DIRS:
        (state.dir / "ovs" / key).mkdir(parents=True, exist_ok=True)
    keys = state.dir / "ssh"
    keys.mkdir(mode=0o700, exist_ok=True)
    for key in ("host_ed25519", "client_ed25519"):
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"dnn-testbed-{state.name}", "-f", str(state.key(key)),
           check=f"ssh-keygen {key}")
    state.key("authorized_keys").write_text(state.key("client_ed25519.pub").read_text())
    host_key = state.key("host_ed25519.pub").read_text().split()
    state.key("known_hosts").write_text(f"{state.server_ip} {host_key[0]} {host_key[1]}\n")
    (state.dir / "sshd_config").write_text(sshd_config(state))

    sh("ip", "netns", "add", state.namespace, check=f"ip netns add {state.namespace}")
    sh("ip", "link", "add", state.veth, "mtu", str(state.mtu), "type", "veth", "peer", "name", "underlay",
       "netns", state.namespace, "mtu", str(state.mtu), check="making the underlay veth")
    sh("ip", "link", "set", state.veth, "alias", f"dnn-testbed emulated server {state.name}")
    prefix = ipaddress.ip_network(state.subnet).prefixlen
    sh("ip", "addr", "add", f"{state.local_ip}/{prefix}", "dev", state.veth, check="addressing the underlay")
    sh("ip", "link", "set", state.veth, "up", check="setting the underlay up")
    for command in (["addr", "add", f"{state.server_ip}/{prefix}", "dev", "underlay"],
                    ["link", "set", "underlay", "up"], ["link", "set", "lo", "up"]):
        sh("ip", "-n", state.namespace, *command, check=f"ip {' '.join(command)} in {state.namespace}")

    if not SSHD_PRIVSEP_DIR.exists():  # sshd refuses to start without it
        SSHD_PRIVSEP_DIR.mkdir(mode=0o755)
        state.privsep_dir_made = True
    ssh_config = Path(state.ssh_config)
    ssh_config.parent.mkdir(parents=True, exist_ok=True)
    ssh_config.write_text(ssh_client_config(state))
    state.save()

    log = open(state.dir / "holder.log", "w")
    holder = subprocess.Popen(holder_command(state), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    log.close()
    deadline = time.monotonic() + READY_S
    while not (state.dir / "sshd.pid").exists() or not answers(state):
        if holder.poll() is not None:
            said = (state.dir / "holder.log").read_text().strip().splitlines()
            raise ServerError(f"sshd in {state.namespace} exited ({said[-1] if said else holder.returncode})")
        if time.monotonic() > deadline:
            raise ServerError(f"sshd in {state.namespace} did not answer root over SSH at {state.server_ip} "
                              f"in {READY_S:.0f} s (log: {state.dir / 'sshd.log'})")
        time.sleep(0.2)
    record = process_record(holder.pid)  # exec'd all the way down: the Popen's pid is sshd's
    state.sshd = asdict(record) if record else None
    state.mount_ns = mount_ns_of(holder.pid)
    state.save()

    # What `make setup` does on a real server: the socket buffers (per network namespace on this kernel),
    # then Open vSwitch started by ovs-ctl, here in the server's own directories.
    done = sh(*ssh_argv(state, f"cd {REPO} && {sys.executable} -m emulation.machine"), timeout=120)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ServerError(f"starting Open vSwitch on {state.name} failed: {said[-1] if said else done.returncode}")
    for daemon in ("ovsdb-server", "ovs-vswitchd"):
        try:
            pid = int((state.dir / "ovs" / "run" / f"{daemon}.pid").read_text())
        except (OSError, ValueError):
            raise ServerError(f"{daemon} of {state.name} wrote no pidfile") from None
        record = process_record(pid)
        if record is None or mount_ns_of(pid) != state.mount_ns:
            raise ServerError(f"{daemon} of {state.name} (pid {pid}) is not running in the server")
        state.ovs[daemon] = asdict(record)
    state.save()
    say(f"emulated server {state.name}: {state.server_ip} (namespace {state.namespace}, underlay {state.veth} "
        f"MTU {state.mtu}, sshd pid {state.sshd['pid'] if state.sshd else '?'}, ovs-vswitchd pid "
        f"{state.ovs['ovs-vswitchd']['pid']})")


def stop(name: str = DEFAULT_NAME, say=lambda line: print(line, file=sys.stderr)) -> list[str]:
    """Remove the emulated server `name`: every process started through it (OVS asked to exit first),
    its namespace, underlay veth, client config and directory; what was removed, one line each."""
    state = ServerState.load(name) or ServerState.plan(name)
    removed = []
    if alive(state.sshd):  # OVS's own stop: the datapath and bridges go with the daemons
        sh("nsenter", "-t", str(state.sshd["pid"]), "-m", "-n", "/usr/share/openvswitch/scripts/ovs-ctl", "stop",
           timeout=30)
    pids = processes_of(state)
    ended = bool(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + TERM_GRACE_S
        while (pids := processes_of(state)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pids:
            break
    if pids:
        raise ServerError(f"processes {pids[:8]} of {name} outlived SIGKILL")
    if ended:
        removed.append(f"the processes started through {name}")
    if sh("ip", "link", "show", state.veth).returncode == 0 and _our_veth(state):
        sh("ip", "link", "del", state.veth, check=f"ip link del {state.veth}")
        removed.append(f"interface {state.veth}")
    if state.namespace in sh("ip", "netns", "list").stdout.split() and ServerState.load(name) is not None:
        sh("ip", "netns", "del", state.namespace, check=f"ip netns del {state.namespace}")
        removed.append(f"network namespace {state.namespace}")
    ssh_config = Path(state.ssh_config)
    if ssh_config.exists() and ssh_config.read_text().startswith("# dnn-testbed emulated server"):
        ssh_config.unlink()
        removed.append(str(ssh_config))
    if state.privsep_dir_made and not other_sshd_running():
        try:
            SSHD_PRIVSEP_DIR.rmdir()
            removed.append(str(SSHD_PRIVSEP_DIR))
        except OSError:
            pass
    if state.dir.exists():
        shutil.rmtree(state.dir)
        removed.append(str(state.dir))
    for line in removed:
        say(f"emulated server {name}: removed {line}")
    return removed


def _our_veth(state: ServerState) -> bool:
    link = json.loads(sh("ip", "-j", "link", "show", state.veth).stdout or "[{}]")[0]
    return link.get("ifalias") == f"dnn-testbed emulated server {state.name}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m emulation.emulated_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"the server's name (default {DEFAULT_NAME})")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET,
                        help=f"the underlay's IPv4 /30: this machine the first address, the server the second "
                             f"(default {DEFAULT_SUBNET})")
    parser.add_argument("--mtu", type=int, default=UNDERLAY_MTU,
                        help=f"the underlay's MTU (default {UNDERLAY_MTU}: the fabric's {DEFAULT_MTU} plus VXLAN's "
                             f"{VXLAN_OVERHEAD})")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            state = start(args.name, args.subnet, args.mtu)
            print(state.server_ip)
        elif args.action == "stop":
            stop(args.name)
        else:
            state = status(args.name)
            if state is None:
                sys.exit(f"emulated server {args.name}: not running")
            print(state.server_ip)
    except ServerError as error:
        sys.exit(f"emulated server {args.name}: {error}")


if __name__ == "__main__":
    main()
