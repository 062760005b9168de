"""The checks of a cluster's servers before any network exists (emulation/preflight.py): each
problem one line naming `cluster.servers[i]`, the server and what is wrong. The probes' shell
script runs in a real shell over fake `ping`, `ovs-appctl`, `ovs-vsctl` and `sudo`; no server, no
SSH, no Open vSwitch."""
import subprocess
import sys

import pytest

from emulation.preflight import (check_servers, parse_probes, probes_script, server_problem, ssh_problem,
                                 underlay_problem)
from topologies.cluster import ClusterError

HERE, THERE, THIRD = "10.0.0.1", "10.0.0.2", "10.0.0.3"

FAKE_PING = r"""#!/bin/sh
size=0; prev=; addr=
for word; do [ "$prev" = -s ] && size=$word; prev=$word; addr=$word; done
packet=$((size + 28))
echo "PING $addr ($addr) $size($packet) bytes of data."
if [ -n "$FAKE_SILENT" ] && [ "$packet" -gt "$FAKE_MTU" ]; then
  echo "--- $addr ping statistics ---"; echo "1 packets transmitted, 0 received, 100% packet loss, time 0ms"; exit 1
fi
if [ "$packet" -gt "${FAKE_MTU:-65536}" ]; then
  echo "ping: local error: message too long, mtu=$FAKE_MTU"
  echo "1 packets transmitted, 0 received, +1 errors, 100% packet loss, time 0ms"; exit 1
fi
echo "$size bytes from $addr: icmp_seq=1 ttl=64 time=0.05 ms"
echo "1 packets transmitted, 1 received, 0% packet loss, time 0ms"
"""
FAKE_APPCTL = r"""#!/bin/sh
if [ -n "$FAKE_NO_VSWITCHD" ]; then
  echo 'ovs-appctl: cannot read pidfile "/var/run/openvswitch/ovs-vswitchd.pid" (No such file or directory)' >&2
  exit 1
fi
echo "ovs-vswitchd (Open vSwitch) 3.1.0"
"""
FAKE_VSCTL = r"""#!/bin/sh
echo "$*" >> "$FAKE_LOG"
case "$*" in
  *"get interface dnnt-preflight ofport"*) [ -n "$FAKE_TAP_TAKEN" ] && echo -1 || echo 65534 ;;
  *"get interface dnnt-preflight error"*)
    [ -n "$FAKE_TAP_TAKEN" ] && echo '"could not open network device dnnt-preflight (Device or resource busy)"' \
      || echo '[]' ;;
esac
"""


@pytest.fixture
def fake_server(tmp_path):
    """Run a probes script as a server would: the fakes first on PATH, the environment's FAKE_* knobs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ping", FAKE_PING), ("ovs-appctl", FAKE_APPCTL), ("ovs-vsctl", FAKE_VSCTL),
                       ("sudo", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for tool in ("tr", "cat"):
        (bin_dir / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True).stdout.strip())
    repo = tmp_path / "repo"
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "python").write_text("")
    (repo / ".venv" / "bin" / "python").chmod(0o755)
    log = tmp_path / "vsctl.log"

    def run(script: str, **knobs: str) -> subprocess.CompletedProcess:
        env = {"PATH": str(bin_dir), "FAKE_LOG": str(log), **knobs}
        return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=10)
    run.bin, run.repo, run.log, run.python = bin_dir, repo, log, str(repo / ".venv" / "bin" / "python")
    return run


def probes(fake_server, mtu=9000, peers=(), **knobs) -> dict[str, str]:
    done = fake_server(probes_script(mtu, list(peers), HERE, repo=str(fake_server.repo), python=fake_server.python),
                       **knobs)
    assert done.returncode == 0, done.stderr
    return parse_probes(done.stdout)


def judged(fake_server, found: dict[str, str], mtu: int, peers: list[str]) -> str | None:
    return server_problem(found, mtu, peers, HERE, repo=str(fake_server.repo), python=fake_server.python)


def test_a_ready_server_passes_and_its_probe_bridge_is_gone(fake_server):
    found = probes(fake_server, peers=[THIRD], FAKE_MTU="9050")
    assert found["sudo"] == found["repo"] == "yes"
    assert found["vswitchd"].startswith("0|ovs-vswitchd (Open vSwitch)")
    assert found["datapath"].startswith("65534|[]|")
    assert set(found) >= {f"ping {size} {address}" for size in (84, 9050) for address in (HERE, THIRD)}
    assert judged(fake_server, found, 9000, [THIRD]) is None
    calls = fake_server.log.read_text().splitlines()
    assert "add-br dnnt-preflight" in calls[0] and "datapath_type=netdev" in calls[0]
    assert calls[-1].endswith("--if-exists del-br dnnt-preflight")  # and the trap deletes it again on exit


def test_an_underlay_too_small_from_the_server_is_one_line(fake_server):
    found = probes(fake_server, FAKE_MTU="1450")
    assert judged(fake_server, found, 9000, []) == (
        "the underlay from it back to this machine carries packets of at most 1450 bytes; topology.mtu 9000 needs "
        "9050 (VXLAN adds 50): raise the underlay's MTU or lower topology.mtu")
    found = probes(fake_server, mtu=1400, FAKE_MTU="1450")
    assert judged(fake_server, found, 1400, []) is None  # 1450 carries MTU 1400


def test_an_underlay_that_drops_big_packets_silently_is_told_from_one_that_drops_ping(fake_server):
    found = probes(fake_server, peers=[THIRD], FAKE_MTU="1500", FAKE_SILENT="1")
    assert judged(fake_server, found, 9000, [THIRD]) == (
        "the underlay from it back to this machine drops unfragmented packets of 9050 bytes where it carries "
        "small ones (1 packets transmitted, 0 received, 100% packet loss, time 0ms); topology.mtu 9000 needs 9050 "
        "(VXLAN adds 50): raise the underlay's MTU or lower topology.mtu")
    lost = (1, "PING x|--- x ping statistics ---|1 packets transmitted, 0 received, 100% packet loss, time 0ms")
    assert underlay_problem(f"from it to {THIRD}", lost, lost, 9000).startswith(
        f"does not answer ping from it to {THIRD} (1 packets transmitted, 0 received, 100% packet loss")


def test_a_server_whose_ovs_vswitchd_is_not_running_is_named_and_gets_no_bridge(fake_server):
    found = probes(fake_server, FAKE_NO_VSWITCHD="1")
    assert "datapath" not in found
    assert not fake_server.log.exists()  # ovs-vsctl would wait for the daemon: never called
    assert judged(fake_server, found, 9000, []) == (
        'its ovs-vswitchd does not answer (ovs-appctl: cannot read pidfile "/var/run/openvswitch/ovs-vswitchd.pid" '
        "(No such file or directory)): start Open vSwitch there (make setup-server)")


def test_a_daemon_that_cannot_make_its_datapath_is_named_and_its_bridge_removed(fake_server):
    found = probes(fake_server, FAKE_TAP_TAKEN="1")
    assert judged(fake_server, found, 9000, []) == (
        "its ovs-vswitchd cannot make a userspace bridge (could not open network device dnnt-preflight (Device or "
        "resource busy)): is another ovs-vswitchd running in its network namespace? (docs/platform.md)")
    assert fake_server.log.read_text().splitlines()[-1].endswith("--if-exists del-br dnnt-preflight")


def test_no_sudo_or_no_repository_there_come_first(fake_server):
    (fake_server.bin / "sudo").unlink()
    found = probes(fake_server, FAKE_NO_VSWITCHD="1")
    assert judged(fake_server, found, 9000, []).startswith("has no sudo")
    done = fake_server(probes_script(9000, [], HERE, repo="/elsewhere", python="/elsewhere/python"),
                       FAKE_NO_VSWITCHD="1")
    found = parse_probes(done.stdout)
    assert found["repo"] == "no"
    assert server_problem({**found, "sudo": "yes"}, 9000, [], HERE, repo="/elsewhere",
                          python="/elsewhere/python") == (
        "has no /elsewhere or no /elsewhere/python: the repository and its venv must be at the same paths as here "
        "(run `make setup-server` there)")


@pytest.mark.parametrize("said, line", [
    ("ssh: connect to host 10.0.0.2 port 22: Connection refused",
     "no SSH server answers on port 22 (ssh: connect to host 10.0.0.2 port 22: Connection refused): start sshd "
     "there (make setup-server)"),
    ("ssh: connect to host 10.0.0.2 port 22: Connection timed out",
     "cannot be reached (ssh: connect to host 10.0.0.2 port 22: Connection timed out)"),
    ("root@10.0.0.2: Permission denied (publickey).",
     "does not take this machine's root SSH key without a password (root@10.0.0.2: Permission denied "
     "(publickey).); docs/cluster.md says how to set up its keys"),
])
def test_why_ssh_failed_says_what_to_fix(said, line):
    assert ssh_problem(255, f"Warning: something\n{said}\n") == line


def world(fake_server, local_mtu=65536, ssh_said="", **knobs):
    """`run` for check_servers: routes and pings from this machine, ssh running the probes in the
    fake server's shell (or failing as `ssh_said`)."""
    calls = []

    def run(argv, **_):
        calls.append(argv)
        if argv[:3] == ["ip", "route", "get"]:
            return subprocess.CompletedProcess(argv, 0, f"{argv[3]} dev eth0 src {HERE} uid 0\n    cache\n", "")
        if argv[0] == "ping":
            return fake_server(" ".join(argv), FAKE_MTU=str(local_mtu))
        assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ConnectTimeout=5" in argv
        if ssh_said:
            return subprocess.CompletedProcess(argv, 255, "", ssh_said + "\n")
        return fake_server(argv[-1].replace(f"-x {sys.executable}", f"-x {fake_server.python}"), **knobs)
    return run, calls


def refusal(run, servers=("localhost", THERE), mtu=9000) -> str:
    with pytest.raises(ClusterError) as raised:
        check_servers(list(servers), mtu, run=run, find=lambda _: "/usr/bin/" + _, resolve=lambda name: name)
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_each_refusal_is_one_line_naming_the_servers_place_and_address(fake_server):
    run, calls = world(fake_server, local_mtu=1450)
    assert refusal(run) == (f"cluster.servers[1]: {THERE}: the underlay from this machine carries packets of at "
                            "most 1450 bytes; topology.mtu 9000 needs 9050 (VXLAN adds 50): raise the underlay's "
                            "MTU or lower topology.mtu")
    assert not any(argv[0] == "ssh" for argv in calls)  # refused before any session on the server
    run, _ = world(fake_server, ssh_said=f"ssh: connect to host {THERE} port 22: Connection refused")
    assert refusal(run).startswith(f"cluster.servers[1]: {THERE}: no SSH server answers on port 22")
    run, _ = world(fake_server, FAKE_NO_VSWITCHD="1")
    assert refusal(run).startswith(f"cluster.servers[1]: {THERE}: its ovs-vswitchd does not answer")
    run, calls = world(fake_server, FAKE_MTU="9050")
    check_servers(["localhost", THERE, THIRD], 9000, run=run, find=lambda _: "/usr/bin/" + _, resolve=lambda n: n)
    sessions = {argv[-2]: argv[-1] for argv in calls if argv[0] == "ssh"}
    assert list(sessions) == [f"root@{THERE}", f"root@{THIRD}"]
    assert f"-s 9022 {THIRD}" in sessions[f"root@{THERE}"]  # each server's underlay to the others too


def test_the_first_server_and_the_tools_here_are_checked_first(fake_server):
    run, calls = world(fake_server)
    with pytest.raises(ClusterError, match=r"^cluster\.servers\[0\]: the first server must be localhost"):
        check_servers([THERE, "localhost"], run=run)
    with pytest.raises(ClusterError, match=r"^cluster\.servers\[1\]: nohost: its name has no IPv4 address here"):
        check_servers(["localhost", "nohost"], run=run, find=lambda _: "/usr/bin/x", resolve=lambda _: None)
    with pytest.raises(ClusterError, match=r"^cluster\.servers: ssh is not installed here"):
        check_servers(["localhost", THERE], run=run, find=lambda _: None)
    with pytest.raises(ClusterError, match=r"^cluster\.servers: sudo is not installed here"):
        check_servers(["localhost", THERE], run=run, find=lambda tool: None if tool == "sudo" else "/usr/bin/ssh",
                      resolve=lambda name: name)
