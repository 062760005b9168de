"""The checks of a cluster's servers before any network exists (docs/cluster.md): each refusal is
one line naming the server's place in `cluster.servers`, the server and what is wrong, e.g.

    cluster.servers[1]: 10.251.0.2: the underlay from this machine carries packets of at most 1450
    bytes; topology.mtu 9000 needs 9050 (VXLAN adds 50): ...

For every server but this one, in order, the first problem found:
- root over SSH without a password (nothing listening, no route, a key refused: each said apart);
- sudo (Mininet's remote nodes run every command through `sudo -E`), the repository and the
  Python running this at the same paths (host apps and the fidelity sampler run from them);
- its ovs-vswitchd answers and makes a userspace datapath: a bridge `dnnt-preflight` is added and
  deleted again in the same SSH session (a second daemon sharing a network namespace with another
  cannot: its datapath's tap `ovs-netdev` is taken, docs/platform.md);
- the underlay carries the fabric's frames inside VXLAN unfragmented, both ways: a DF ping of
  topology.mtu + VXLAN_OVERHEAD bytes from this machine to the server, from the server back to
  this machine's address towards it, and from the server to every other server.
Nothing is left running on a server: the probes are one SSH session each, which removes its bridge
whatever happened. The parsing is plain Python on what the commands said (`server_problem`), so it
is tested on recorded answers without a server.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from shutil import which
from typing import Callable

from common.frames import DEFAULT_MTU
from common.owner import OWNER_KEY
from common.paths import REPO
from emulation.cluster import VXLAN_OVERHEAD, local_address_towards
from topologies.cluster import LOCAL, ClusterError

SSH_FAILED = 255  # what ssh exits with when it fails itself; otherwise the remote command's status
CONNECT_TIMEOUT_S = 5
PROBES_TIMEOUT_S = 40.0  # the whole session: OVS answers in milliseconds, a failed ping waits PING_WAIT_S
PING_WAIT_S = 1
SMALL_PING = 56  # ping's default payload: answered whenever the server answers ping at all
ICMP_IP_HEADERS = 28  # a ping's IP packet is its payload plus 8 bytes of ICMP and 20 of IPv4
PROBE_BRIDGE = "dnnt-preflight"
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
PATH_MTU = re.compile(r"mtu ?= ?(\d+)")  # "local error: message too long, mtu=1450", "Frag needed ... (mtu = 1450)"


def underlay_mtu_needed(mtu: int) -> int:
    """The IP packet size the underlay must carry for a fabric of this MTU: each frame in VXLAN."""
    return mtu + VXLAN_OVERHEAD


def ping_argv(address: str, packet_bytes: int) -> list[str]:
    """One ping whose IPv4 packet is `packet_bytes` long, never fragmented on its way."""
    return ["ping", "-n", "-M", "do", "-c", "1", "-W", str(PING_WAIT_S), "-s", str(packet_bytes - ICMP_IP_HEADERS),
            address]


def probes_script(mtu: int, peers: list[str], back_to: str, repo: str = str(REPO),
                  python: str = sys.executable) -> str:
    """What one SSH session runs on a server: `key=value` lines for server_problem. Pings print
    `ping <size> <address>=<exit status>|<its output, lines joined by |>`."""
    needed = underlay_mtu_needed(mtu)
    bridge = PROBE_BRIDGE
    lines = [
        "oneline() { printf '%s' \"$1\" | tr '\\n' '|'; }",
        'if command -v sudo >/dev/null 2>&1; then echo sudo=yes; else echo sudo=no; fi',
        f'if [ -d {shlex.quote(repo)} ] && [ -x {shlex.quote(python)} ]; then echo repo=yes; else echo repo=no; fi',
        'said=$(ovs-appctl -t ovs-vswitchd --timeout=3 version 2>&1); status=$?',
        'printf "vswitchd=%s|%s\\n" "$status" "$(oneline "$said")"',
        'if [ "$status" = 0 ]; then',
        f'  trap "ovs-vsctl --timeout=5 --if-exists del-br {bridge} >/dev/null 2>&1" EXIT',
        f'  said=$(ovs-vsctl --timeout=5 --if-exists del-br {bridge} -- add-br {bridge} '
        f'-- set bridge {bridge} datapath_type=netdev external_ids:{OWNER_KEY}=preflight 2>&1)',
        f'  port=$(ovs-vsctl --timeout=3 get interface {bridge} ofport 2>&1)',
        f'  error=$(ovs-vsctl --timeout=3 get interface {bridge} error 2>&1)',
        f'  ovs-vsctl --timeout=5 --if-exists del-br {bridge} >/dev/null 2>&1',
        '  printf "datapath=%s|%s|%s\\n" "$(oneline "$port")" "$(oneline "$error")" "$(oneline "$said")"',
        'fi',
    ]
    for address in [back_to, *peers]:
        for size in (SMALL_PING + ICMP_IP_HEADERS, needed):
            argv = shlex.join(ping_argv(address, size))
            lines.append(f'said=$({argv} 2>&1); printf "ping {size} %s=%s|%s\\n" {shlex.quote(address)} "$?" '
                         '"$(oneline "$said")"')
    return "\n".join(lines) + "\n"


def parse_probes(text: str) -> dict[str, str]:
    """The `key=value` lines of probes_script's output (the key up to the first `=`)."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            found[key.strip()] = value.strip()
    return found


def ssh_problem(status: int, stderr: str) -> str:
    """Why ssh failed, as ssh said it, in the words that tell the user what to fix."""
    said = [line for line in stderr.strip().splitlines() if line.strip()]
    last = said[-1].strip() if said else f"ssh exited with {status}"
    if "Connection refused" in last:
        return f"no SSH server answers on port 22 ({last}): start sshd there (make setup-server)"
    if any(words in last for words in ("timed out", "No route to host", "Network is unreachable",
                                       "Could not resolve hostname", "Name or service not known")):
        return f"cannot be reached ({last})"
    return (f"does not take this machine's root SSH key without a password ({last}); "
            "docs/cluster.md says how to set up its keys")


def ping_problem(status: int, said: str) -> tuple[int | None, str] | None:
    """None when the ping went through; else the largest packet the path takes when the answer
    says it (a local interface's MTU, an ICMP `Frag needed`), and what ping said first."""
    if status == 0:
        return None
    match = PATH_MTU.search(said)
    return (int(match[1]) if match else None), ping_said(said) or f"ping exited with {status}"


def ping_said(said: str) -> str:
    """ping's telling line in its output (lines joined by |): an error or an ICMP answer, else its
    statistics line."""
    pieces = [piece.strip() for piece in said.split("|") if piece.strip()]
    telling = [piece for piece in pieces if not piece.startswith(("PING ", "---", "rtt "))]
    errors = [piece for piece in telling if "packets transmitted" not in piece]
    return (errors or telling or [""])[0]


def underlay_problem(where: str, small: tuple[int, str], big: tuple[int, str], mtu: int) -> str | None:
    """The line about an underlay path (`where`: 'from this machine', 'from it to 10.0.0.1'): the
    small ping tells a path that drops big packets from one that drops ping."""
    needed = underlay_mtu_needed(mtu)
    big_problem = ping_problem(*big)
    if big_problem is None:
        return None
    fix = (f"topology.mtu {mtu} needs {needed} (VXLAN adds {VXLAN_OVERHEAD}): raise the underlay's MTU or "
           "lower topology.mtu")
    carried, said = big_problem
    if carried is not None:
        return f"the underlay {where} carries packets of at most {carried} bytes; {fix}"
    if ping_problem(*small) is not None:
        return (f"does not answer ping {where} ({said}), so the underlay cannot be checked; it must carry "
                f"{needed}-byte packets unfragmented")
    return (f"the underlay {where} drops unfragmented packets of {needed} bytes where it carries small ones "
            f"({said}); {fix}")


def _ping_result(value: str) -> tuple[int, str]:
    status, _, said = value.partition("|")
    try:
        return int(status), said
    except ValueError:
        return 1, value


def server_problem(probes: dict[str, str], mtu: int, peers: list[str], back_to: str,
                   repo: str = str(REPO), python: str = sys.executable) -> str | None:
    """The first problem probes_script found on a server, None when it is ready."""
    if probes.get("sudo") != "yes":
        return "has no sudo, and Mininet's remote nodes start every command through it (run `make setup-server` there)"
    if probes.get("repo") != "yes":
        return (f"has no {repo} or no {python}: the repository and its venv must be at the same paths as here "
                "(run `make setup-server` there)")
    status, said = _ping_result(probes.get("vswitchd", "1|no answer"))
    if status != 0:
        pieces = [piece.strip() for piece in said.split("|") if piece.strip()]
        why = pieces[-1] if pieces else f"ovs-appctl exited with {status}"
        return f"its ovs-vswitchd does not answer ({why}): start Open vSwitch there (make setup-server)"
    port, error, added = (probes.get("datapath", "") + "||").split("|")[:3]
    if not port.strip().lstrip("-").isdigit() or int(port) < 0:
        why = next((text.strip().strip('"') for text in (error, added, port) if text.strip() and text.strip() != "[]"),
                   "no port")
        return (f"its ovs-vswitchd cannot make a userspace bridge ({why}): is another ovs-vswitchd running in "
                "its network namespace? (docs/platform.md)")
    for address in [back_to, *peers]:
        where = "from it back to this machine" if address == back_to else f"from it to {address}"
        small = _ping_result(probes.get(f"ping {SMALL_PING + ICMP_IP_HEADERS} {address}", "1|no answer"))
        big = _ping_result(probes.get(f"ping {underlay_mtu_needed(mtu)} {address}", "1|no answer"))
        problem = underlay_problem(where, small, big, mtu)
        if problem:
            return problem
    return None


def server_address(server: str) -> str | None:
    """The server's IPv4 address, as Mininet's cluster classes find it (None: its name has none)."""
    from mininet.examples.cluster import RemoteMixin
    return RemoteMixin.findServerIP(server)


def _joined(done: subprocess.CompletedProcess) -> tuple[int, str]:
    return done.returncode, "|".join(line for line in (done.stdout + done.stderr).splitlines() if line.strip())


def check_server(server: str, servers: list[str], mtu: int, run: Callable = subprocess.run,
                 resolve: Callable = server_address) -> str | None:
    """The server's problem, or None: its underlay from here, then everything over SSH."""
    address = resolve(server)
    if address is None:
        return "its name has no IPv4 address here (getent ahostsv4)"
    back_to = local_address_towards(address, run)
    if back_to is None:
        return "no route from this machine to it"
    small = _joined(run(ping_argv(address, SMALL_PING + ICMP_IP_HEADERS), capture_output=True, text=True))
    big = _joined(run(ping_argv(address, underlay_mtu_needed(mtu)), capture_output=True, text=True))
    if small[0] != 0 and big[0] != 0 and PATH_MTU.search(big[1]) is None:
        small = big = (0, "")  # no ping answered: SSH says why, or the server drops ping
    problem = underlay_problem("from this machine", small, big, mtu)
    if problem:
        return problem
    peers = [other for other in servers[1:] if other != server]
    try:
        done = run(["ssh", *SSH_OPTIONS, f"root@{server}", probes_script(mtu, peers, back_to)],
                   capture_output=True, text=True, timeout=PROBES_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"its checks over SSH did not finish in {PROBES_TIMEOUT_S:.0f} s"
    if done.returncode == SSH_FAILED and "sudo=" not in done.stdout:
        return ssh_problem(done.returncode, done.stderr)
    return server_problem(parse_probes(done.stdout), mtu, peers, back_to)


def check_servers(servers: list[str], mtu: int = DEFAULT_MTU, run: Callable = subprocess.run,
                  find: Callable = which, resolve: Callable = server_address) -> None:
    """The first server is this machine and every other one is ready for a fabric of this MTU
    (the module's docstring lists what that takes); ClusterError naming the first that is not."""
    if servers[0] != LOCAL:
        raise ClusterError(f"cluster.servers[0]: the first server must be {LOCAL} (this machine runs the controller "
                           f"and keeps the results), not {servers[0]!r}")
    if len(servers) > 1 and find("ssh") is None:
        raise ClusterError("cluster.servers: ssh is not installed here (make setup installs openssh-client)")
    for index, server in enumerate(servers[1:], start=1):
        problem = check_server(server, servers, mtu, run, resolve)
        if problem:
            raise ClusterError(f"cluster.servers[{index}]: {server}: {problem}")
    if len(servers) > 1 and find("sudo") is None:
        raise ClusterError("cluster.servers: sudo is not installed here, and Mininet's remote nodes start every "
                           "command through it (make setup-server installs it)")
