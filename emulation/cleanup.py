"""Remove what a fabric left behind, and only that: `make clean-net` (python -m emulation.cleanup).

What a fabric owns is marked with its id (topologies/marks.py), never matched by a name pattern
(another Mininet network may well have a `leaf1` or an `edge1-eth0`, and a PID is reused once its
process ends):
- processes: those the fabric state file records with their start time; a recorded PID that now
  belongs to another process has another start time and is left alone;
- OVS bridges: the external id OWNER_KEY=fabric-<id>;
- interfaces: the alias `dnn-testbed fabric-<id>` that every interface of its links carries;
- nftables tables: the comment OWNER_KEY (only the runner's loss faults make them).
Clean-up holds the fabric lock, so no fabric runs meanwhile: whatever carries a fabric's mark is
a leftover, of the fabric the state file records or of one whose record was lost.

A network built by hand (`mn --custom topologies/leafspine.py`) carries the mark `hand-run`: it
records nothing and may still be running, so it is left alone unless `--hand-run` asks for it.
Unlike `mn -c`, other bridges, other processes and the system temp folder are left alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from common.files import write_text
from common.owner import OWNER_KEY
from common.schema import SchemaError, build, knob
from emulation.machine import vswitchd_pid
from topologies.marks import is_fabric, owner_of_alias, owner_of_external_id

STATE_DIR = Path("/run/dnn-testbed")
LOCK_FILE = STATE_DIR / "fabric.lock"
STATE_FILE = STATE_DIR / "fabric.json"
TERM_GRACE_S = 3.0
OVS_TIMEOUT_S = 5


def say_stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class ProcessRecord:
    """A process as the state file knows it: its PID and when it started (clock ticks since boot)."""
    pid: int = knob(allowed="a PID > 0", check=lambda pid: pid > 0)
    start: int = knob(allowed="clock ticks since boot, >= 0", check=lambda start: start >= 0)
    argv0: str = knob("")


@dataclass(frozen=True)
class FabricRecord:
    """The state file: the fabric's id (its mark, topologies/marks.py), the process that runs it,
    every process it started and its switches."""
    fabric: str = knob("", allowed="the fabric's id")
    owner: ProcessRecord | None = knob(None)
    processes: list[ProcessRecord] = knob([])
    switches: list[str] = knob([])


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
    return ProcessRecord(pid, int(fields[19]), argv0)


def is_alive(record: ProcessRecord) -> bool:
    """The recorded process still runs: same PID, same start time, not a zombie."""
    fields = _stat_fields(record.pid)
    return fields is not None and int(fields[19]) == record.start and fields[0] != "Z"


def kill_recorded(records: list[ProcessRecord], grace: float = TERM_GRACE_S) -> list[int]:
    """SIGTERM the recorded processes that are still the ones recorded, SIGKILL those left after
    `grace` seconds; returns their PIDs. Each signal is sent only after checking the start time."""
    alive = [record for record in records if is_alive(record)]
    for record in alive:
        try:
            os.kill(record.pid, signal.SIGTERM)
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
                os.kill(record.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return [record.pid for record in alive]


def kill_group(proc: subprocess.Popen, grace: float = TERM_GRACE_S) -> None:
    """SIGTERM a process group we started, then SIGKILL what is left after `grace` seconds."""
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


# -- marks --------------------------------------------------------------------------------------
def parse_bridge_marks(listing: str) -> dict[str, str]:
    """bridge -> owner, from `ovs-vsctl --format=json --columns=name,external_ids list Bridge`,
    for the bridges that carry our mark."""
    marks = {}
    for name, (_, pairs) in json.loads(listing or '{"data": []}')["data"]:
        value = dict(pairs).get(OWNER_KEY)
        if value is not None:
            marks[name] = owner_of_external_id(value)
    return marks


def marked_bridges() -> dict[str, str]:
    """Every OVS bridge carrying our mark -> its owner (one ovs-vsctl call)."""
    out = subprocess.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S}", "--format=json",
                          "--columns=name,external_ids", "list", "Bridge"], capture_output=True, text=True)
    return parse_bridge_marks(out.stdout) if out.returncode == 0 else {}


def parse_interface_marks(listing: str) -> dict[str, str]:
    """interface -> owner, from `ip -j link show`, for the interfaces that carry our mark."""
    marks = {}
    for link in json.loads(listing or "[]"):
        owner = owner_of_alias(link.get("ifalias"))
        if owner is not None:
            marks[link["ifname"]] = owner
    return marks


def marked_interfaces() -> dict[str, str]:
    """Interfaces of this (the root) namespace carrying our mark -> their owner."""
    return parse_interface_marks(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout)


def removable(marks: dict[str, str], hand_run: bool = False) -> list[str]:
    """What clean-up removes of marked things: every fabric's; with hand_run, every one."""
    return [name for name, owner in marks.items() if hand_run or is_fabric(owner)]


def our_bridges(hand_run: bool = False) -> list[str]:
    return removable(marked_bridges(), hand_run)


def our_interfaces(hand_run: bool = False) -> list[str]:
    return removable(marked_interfaces(), hand_run)


def our_nft_tables() -> list[tuple[str, str]]:
    """(family, name) of root-namespace nftables tables carrying our comment."""
    ruleset = subprocess.run(["nft", "list", "ruleset"], capture_output=True, text=True).stdout
    return re.findall(rf'^table (\S+) (\S+) {{\n\s*comment "{OWNER_KEY}"', ruleset, re.M)


# -- the state file -----------------------------------------------------------------------------
def read_state(say: Callable[[str], None] = say_stderr) -> FabricRecord | None:
    """The recorded fabric; None when there is no state file, or one that is not a fabric record
    (an older testbed's, a truncated or foreign file), which `say` reports in one line."""
    try:
        text = STATE_FILE.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        say(f"clean-up: {STATE_FILE} cannot be read ({error.strerror}); taken as no record")
        return None
    try:
        return build(FabricRecord, json.loads(text), "state")
    except (ValueError, RecursionError) as error:  # JSONDecodeError and SchemaError are ValueErrors
        why = str(error) if isinstance(error, SchemaError) else f"not JSON: {error}"
        say(f"clean-up: {STATE_FILE} is not a fabric record ({why[:200]}); taken as no record")
        return None


def write_state(record: FabricRecord) -> None:
    write_text(STATE_FILE, json.dumps(dataclasses.asdict(record)))


def clean_stale(verbose: bool = False, hand_run: bool = False, say: Callable[[str], None] = print) -> list[str]:
    """Remove what a fabric that no longer runs left behind (call with the fabric lock held);
    hand_run: also what hand-run networks marked ours. Returns what was done, one line each."""
    done = []
    record = read_state()
    if record is not None:
        killed = kill_recorded([*record.processes])
        if killed:
            done.append(f"stopped {len(killed)} recorded processes {killed}")
    STATE_FILE.unlink(missing_ok=True)
    bridges, interfaces = marked_bridges(), marked_interfaces()
    # ovs-vsctl waits for ovs-vswitchd to apply a change: without one, the database change is enough
    wait = [] if vswitchd_pid() is not None else ["--no-wait"]
    for br in removable(bridges, hand_run):
        subprocess.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S}", *wait, "del-br", br], capture_output=True)
        done.append(f"deleted bridge {br} ({bridges[br]})")
    for intf in removable(interfaces, hand_run):
        subprocess.run(["ip", "link", "del", intf], capture_output=True)
        done.append(f"deleted interface {intf} ({interfaces[intf]})")
    for family, name in our_nft_tables():
        subprocess.run(["nft", "delete", "table", family, name], capture_output=True)
        done.append(f"deleted nftables table {family} {name}")
    if verbose:
        kept = sorted(set(bridges) - set(removable(bridges, hand_run)))
        say("\n".join(done) or "nothing of a fabric was left")
        if kept:
            say(f"left alone: the bridges {', '.join(kept)} of networks built by hand with our Topo "
                "(--hand-run removes them, running or not)")
    return done


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m emulation.cleanup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true",
                        help="clean even while a fabric holds the lock (it will break)")
    parser.add_argument("--hand-run", action="store_true",
                        help="also remove the bridges and interfaces of networks built by hand with our Topo "
                             "(mn --custom topologies/leafspine.py), even a running one")
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
        clean_stale(verbose=True, hand_run=args.hand_run)


if __name__ == "__main__":
    main()
