"""A whole fabric across two servers on one machine: the second is emulated
(emulation/emulated_server.py: a network namespace with its own sshd and Open vSwitch behind an
underlay veth sized for VXLAN). The runner places the smoke spec's leaf-spine across both with the
`cluster:` section users write, the crossing links carry the traffic through VXLAN, and training
ends with the parameters it ends with on one machine."""
import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.frames import DEFAULT_MTU
from emulation import emulated_server
from emulation.fabric import Fabric
from helpers import REPO
from helpers.fabric import experiments_cli, finish, left_on_the_server, leftovers

SMOKE = REPO / "experiments" / "smoke.yaml"
NAME, SUBNET = "itest", "10.251.0.4/30"
VXLAN_COUNTER = "dnnt_vxlan"


def sh(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True)


@pytest.fixture(scope="module")
def second_server():
    state = emulated_server.start(NAME, SUBNET)
    try:
        assert emulated_server.start(NAME, SUBNET).sshd == state.sshd, "a second start reuses the running server"
        yield state
    finally:
        emulated_server.stop(NAME)
    assert state.namespace not in sh("ip", "netns", "list").stdout.split()
    assert sh("ip", "link", "show", state.veth).returncode != 0
    assert not Path(state.directory).exists() and not Path(state.ssh_config).exists()
    assert emulated_server.processes_of(state) == []


def count_vxlan(state) -> None:
    """nftables counters of the VXLAN datagrams the server receives and sends (in its own namespace)."""
    rules = f"""table inet {VXLAN_COUNTER} {{
        chain input {{ type filter hook input priority 0; udp dport 4789 counter; }}
        chain output {{ type filter hook output priority 0; udp dport 4789 counter; }}
    }}"""
    done = subprocess.run(["ip", "netns", "exec", state.namespace, "nft", "-f", "-"], input=rules, text=True,
                          capture_output=True)
    assert done.returncode == 0, done.stderr


def vxlan_counted(state) -> dict[str, dict[str, int]]:
    listing = json.loads(sh("ip", "netns", "exec", state.namespace, "nft", "-j", "list", "table", "inet",
                            VXLAN_COUNTER).stdout)
    counted = {}
    for item in listing["nftables"]:
        rule = item.get("rule")
        if rule:
            counter = next(expr["counter"] for expr in rule["expr"] if "counter" in expr)
            counted[rule["chain"]] = {"packets": counter["packets"], "bytes": counter["bytes"]}
    return counted


def run_smoke(out: Path, *extra: str) -> None:
    process = experiments_cli(str(SMOKE), "--out", str(out), *extra, cwd=out.parent)
    try:  # a fabric of another user holds the lock for up to 600 s before this one starts
        status, stdout, stderr = finish(process, timeout=900)
    except BaseException:  # timed out or interrupted: the fabric goes before the fixture removes its server
        process.terminate()  # the runner tears its fabric down on SIGTERM
        finish(process, timeout=60)
        raise
    assert status == 0, stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv")
    assert runs["iter_time_mean_s"].gt(0).all(), runs.to_dict("records")
    for run_json in out.glob("runs/*/run.json"):
        record = json.loads(run_json.read_text())
        assert record["status"] == "ok", (run_json.parent.name, record.get("error"))


def crossed(out: Path, servers: dict[str, list[str]]) -> dict[str, int]:
    """What the crossing links carried (both ways), from the controller's port statistics: each
    crossing link counted at the end on this machine."""
    where = {node: server for server, nodes in servers.items() for node in nodes}
    links = pd.read_csv(out / "links.csv")
    mine = links[links["switch"].map(where).eq("localhost") & links["peer"].map(where).ne("localhost")]
    return {"packets": int(mine["tx_pkts"].sum() + mine["rx_pkts"].sum()),
            "bytes": int(mine["tx_bytes"].sum() + mine["rx_bytes"].sum())}


def test_the_smoke_spec_trains_across_two_servers_as_on_one(tmp_path, second_server):
    count_vxlan(second_server)
    two = tmp_path / "two-servers"
    run_smoke(two, "--set", f"cluster.servers=[localhost, {second_server.server_ip}]")
    fabric, = [json.loads(path.read_text()) for path in two.glob("fabrics/*/fabric.json")]
    assert fabric["servers"] == {"localhost": ["h1", "h2", "leaf1", "spine1"],
                                 second_server.server_ip: ["h3", "h4", "leaf2", "spine2"]}
    assert fabric["crossing_links"] == 2
    assert fabric["clock_offsets"][second_server.server_ip] == {"offset_s": 0.0, "error_s": 0.0}  # one kernel

    # Every frame that crossed went through the tunnel: the server's kernel sent or received a
    # VXLAN datagram (inner frame + 36 bytes of VXLAN, UDP and IP) for each.
    counted = vxlan_counted(second_server)
    through = crossed(two, fabric["servers"])
    tunnelled = {key: counted["input"][key] + counted["output"][key] for key in ("packets", "bytes")}
    assert through["bytes"] > 100_000, through
    assert tunnelled["packets"] >= through["packets"] and tunnelled["bytes"] >= through["bytes"], (tunnelled, through)
    assert counted["input"]["packets"] > 0 and counted["output"]["packets"] > 0

    # Each server sampled for the guard by its own sampler: the server's ovs-vswitchd forwarded, and
    # runs.csv's verdict names each failing server (the smoke spec is CPU-bound).
    for run_dir in [path for path in (two / "runs").iterdir() if path.is_dir()]:
        samples = pd.read_csv(run_dir / "servers" / second_server.server_ip / "cpu.csv")
        assert len(samples) >= 2 and samples["vswitchd_thread_util"].gt(0).any(), run_dir.name
        queues = pd.read_csv(run_dir / "servers" / second_server.server_ip / "queues.csv")
        assert set(queues["switch"]) == {"leaf2", "spine2"}, run_dir.name
    reasons = pd.read_csv(two / "runs.csv", keep_default_na=False)["fidelity_reason"]
    assert all(part.split(": ", 1)[0] in ("localhost", second_server.server_ip)
               for reason in reasons for part in reason.split(" | ") if part), list(reasons)

    one = tmp_path / "one-machine"
    run_smoke(one)
    for run in ("mode=allreduce,rep=1", "mode=ps,rep=1"):
        here = np.load(one / "runs" / run / "h1-worker0" / "model.npz")
        across = np.load(two / "runs" / run / "h1-worker0" / "model.npz")
        assert set(here.files) == set(across.files)
        assert max(np.abs(here[name] - across[name]).max() for name in here.files) <= 1e-6, run
    assert leftovers() == [] and left_on_the_server(second_server) == []


def test_a_frame_of_the_fabrics_mtu_crosses_between_hosts_on_different_servers_whole(second_server):
    params = {"spines": 2, "leaves": 2, "hosts_per_leaf": 2}
    with Fabric("leafspine", params, servers=["localhost", second_server.server_ip]) as fab:
        assert [host.name for host in fab.hosts if getattr(host, "server", "localhost") != "localhost"] == ["h3", "h4"]
        fab.wait_reachable(timeout=60)
        said = fab.host("h1").cmd(f"ping -c 3 -W 2 -M do -s {DEFAULT_MTU - 28} {fab.host('h4').IP()}")
        assert " 0% packet loss" in said, said
        fab.popen("h4", ["sleep", "600"])  # runs on the server under ssh: the fabric's stop ends it there
    assert leftovers() == [] and left_on_the_server(second_server) == []
