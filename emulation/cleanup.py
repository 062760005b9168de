"""Remove every leftover of ours, and only ours: `make clean-net` (python -m emulation.cleanup).

Ours means marked by us, never matched by a name pattern (another Mininet network may well have a
`leaf1` or an `edge1-eth0`, and a PID is reused once its process ends):
- processes: those the fabric state file records with their start time; a recorded PID that now
  belongs to another process has another start time and is left alone;
- OVS bridges: the external id OWNER_KEY;
- interfaces: the alias OWNER_KEY that every interface of our links carries;
- nftables tables: the comment OWNER_KEY (the runner's loss faults).
Unlike `mn -c`, other bridges, other processes and the system temp folder are left alone.
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
from typing import TypedDict

from common.owner import OWNER_KEY

STATE_DIR = Path("/run/dnn-testbed")
LOCK_FILE = STATE_DIR / "fabric.lock"
STATE_FILE = STATE_DIR / "fabric.json"
TERM_GRACE_S = 3.0


class ProcessRecord(TypedDict):
    """A process as the state file knows it: its PID and when it started (clock ticks since boot)."""
    pid: int
    start: int
    argv0: str


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_record(pid: int) -> ProcessRecord | None:
    """The record of a running process (None when it is gone)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        argv0 = ""
    return {"pid": pid, "start": int(fields[19]), "argv0": argv0}


def is_alive(record: ProcessRecord) -> bool:
    """The recorded process still runs: same PID, same start time, not a zombie."""
    fields = _stat_fields(record["pid"])
    return fields is not None and int(fields[19]) == record["start"] and fields[0] != "Z"


def kill_recorded(records: list[ProcessRecord], grace: float = TERM_GRACE_S) -> list[int]:
    """SIGTERM the recorded processes that are still the ones recorded, SIGKILL those left after
    `grace` seconds; returns their PIDs. Each signal is sent only after checking the start time."""
    alive = [record for record in records if is_alive(record)]
    for record in alive:
        try:
            os.kill(record["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    left = alive
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [record for record in left if is_alive(record)]
    for record in left:
        if is_alive(record):
            try:
                os.kill(record["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [record["pid"] for record in alive]


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
    """Interfaces of this (the root) namespace carrying our alias."""
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return [link["ifname"] for link in json.loads(out or "[]") if link.get("ifalias") == OWNER_KEY]


def our_nft_tables() -> list[tuple[str, str]]:
    """(family, name) of root-namespace nftables tables carrying our comment."""
    ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
    return re.findall(rf'^table (\S+) (\S+) {{\n\s*comment "{OWNER_KEY}"', ruleset, re.M)


def read_state() -> dict:
    try:
        return json.loads(STATE_FILE.read_text())
    except (OSError, ValueError):
        return {}


def write_state(state: dict) -> None:
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(STATE_FILE)


def clean_stale(verbose: bool = False) -> list[str]:
    """Remove what a killed fabric left behind (call with the fabric lock held)."""
    done = []
    if STATE_FILE.exists():
        killed = kill_recorded(read_state().get("processes", []))
        if killed:
            done.append(f"stopped {len(killed)} recorded processes {killed}")
        STATE_FILE.unlink(missing_ok=True)
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
    parser = argparse.ArgumentParser(prog="python -m emulation.cleanup", description=__doc__)
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
        clean_stale(verbose=True)


if __name__ == "__main__":
    main()

