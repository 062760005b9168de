"""Remove every leftover of ours, and only ours: `make clean-net` (python -m topologies.cleanup).

Ours means: what the fabric state file records (controller, host shells, host processes), OVS
bridges carrying our external id, the veths of our switches, nftables tables named dnntb*, and
`python -m controller|hostapps|experiments` processes started from this repo. Unlike `mn -c`, other bridges, other
controllers and the system temp folder are left alone.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from topologies.nodes import OWNER_KEY

REPO = Path(__file__).resolve().parent.parent
STATE_DIR = Path("/run/dnn-testbed")
LOCK_FILE = STATE_DIR / "fabric.lock"
STATE_FILE = STATE_DIR / "fabric.json"
OUR_MODULES = ("controller", "hostapps", "experiments")
SWITCH_INTF = re.compile(r"^(leaf|spine|core|agg|edge)\d+-eth\d+$")


def _kill(pids: list[int]) -> list[int]:
    """SIGTERM, wait up to 3 s, then SIGKILL; returns the pids that existed."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            alive.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 3
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _zombie(p)]
        time.sleep(0.1)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def our_processes(exclude: set[int]) -> list[int]:
    """Processes running `-m controller|hostapps|experiments` with this repo as working dir."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in exclude:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg == b"-m" and argv[i + 1].split(b".")[0].decode(errors="replace") in OUR_MODULES \
                    and cwd.startswith(str(REPO)):
                pids.append(int(proc.name))
    return pids


def mininet_host_shells() -> list[int]:
    """Live `bash ... mininet:NAME` host shells (zombies of dead ones do not count)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"mininet:" in (proc / "cmdline").read_bytes() \
                    and not _zombie(int(proc.name)):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def our_bridges() -> list[str]:
    out = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True)
    bridges = []
    for br in out.stdout.split():
        mark = subprocess.run(["ovs-vsctl", "--timeout=5", "br-get-external-id", br, OWNER_KEY],
                              capture_output=True, text=True).stdout.strip()
        if mark == "1":
            bridges.append(br)
    return bridges


def our_interfaces() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]
    return [n for n in names if SWITCH_INTF.match(n)]


def clean_state() -> None:
    """Forget the state file of a fabric that stopped normally."""
    STATE_FILE.unlink(missing_ok=True)


def our_nft_tables() -> list[tuple[str, str]]:
    """(family, name) of root-namespace nftables tables of ours (the runner's loss faults)."""
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return [(family, name) for family, name in re.findall(r"^table (\S+) (dnntb\S*)$", out, re.M)]


def clean_stale(strays: bool = False, verbose: bool = False) -> list[str]:
    """Remove what a killed fabric left behind (call with the fabric lock held).

    strays: also kill `python -m controller|hostapps|experiments` processes started from this
    repo that no state file records; only for `make clean-net`, since a fabric starting up must
    not kill a live runner or test of ours that merely sits between two fabrics."""
    done = []
    if STATE_FILE.exists():
        try:
            state = json.loads(STATE_FILE.read_text())
        except ValueError:
            state = {}
        pids = [p for p in [state.get("controller_pid"), *state.get("process_pids", []),
                            *state.get("host_pids", [])] if p]
        if _kill(pids):
            done.append(f"killed {len(pids)} recorded processes")
        STATE_FILE.unlink(missing_ok=True)
    if strays:
        killed = _kill(our_processes(exclude={os.getpid(), os.getppid()}))
        if killed:
            done.append(f"killed stray processes {killed}")
    for br in our_bridges():
        subprocess.run(["ovs-vsctl", "--timeout=5", "del-br", br], capture_output=True)
        done.append(f"deleted bridge {br}")
    for intf in our_interfaces():
        subprocess.run(["ip", "link", "del", intf], capture_output=True)
        done.append(f"deleted interface {intf}")
    for family, name in our_nft_tables():
        subprocess.run(["nft", "delete", "table", family, name], capture_output=True)
        done.append(f"deleted nftables table {family} {name}")
    if verbose:
        print("\n".join(done) or "nothing of ours was left")
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m topologies.cleanup", description=__doc__)
    parser.add_argument("--force", action="store_true",
                        help="clean even while a fabric holds the lock (it will break)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("error: clean-net needs root (it deletes OVS bridges and interfaces)")
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not args.force:
                sys.exit("error: a fabric is running right now (it holds "
                         f"{LOCK_FILE}); stop it, or use --force")
        clean_stale(strays=True, verbose=True)


if __name__ == "__main__":
    main()
