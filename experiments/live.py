"""The live view of a running experiment (`python -m experiments run SPEC --live [PORT]`): a page on
127.0.0.1 with the run list and its progress, the current run's iteration times against its lower
bound as they arrive, the fabric drawn tier by tier with each link coloured by its utilization
(the controller's port statistics), the class queues' drops and the fidelity guard's state. A run
of several jobs shows them apart: each job's iteration times in a colour of its own, its progress,
and its hosts in that colour on the fabric.

Nothing leaves the machine and nothing is fetched from elsewhere: the page (experiments/live.html)
is plain HTML, CSS and JavaScript that polls /state.json once a second. The server answers only
GET requests whose Host is this address (no DNS rebinding) and never serves files but those two.
The runner feeds it through Progress (experiments/progress.py); its cost is a thread answering a
request a second and polling the controller once a second.
"""
from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "live.html"
POLL_S = 1.0
# Rows of the drawing, top to bottom, by the layout's roles (topologies/layout.py).
ROWS = (("spine", "core"), ("agg",), ("leaf", "edge"), ("host",))


class LiveError(RuntimeError):
    """The live view cannot serve (its port is taken); the message says what to do."""


def drawing(layout) -> dict[str, list[dict]]:
    """The fabric's nodes at positions in a unit square, tier by tier, and its links."""
    nodes = []
    rows = [[node for node in layout.nodes if node.role in roles] for roles in ROWS]
    rows = [row for row in rows if row]
    for r, row in enumerate(rows):
        for i, node in enumerate(row):
            nodes.append({"name": node.name, "role": node.role, "x": (i + 0.5) / len(row),
                          "y": (r + 0.5) / len(rows)})
    links = [{"a": link.a.name, "b": link.b.name, "tier": link.tier} for link in layout.links]
    return {"nodes": nodes, "links": links}


def utilization(previous: list[dict], latest: list[dict], rates: dict[tuple[str, int], tuple[str, float]]
                ) -> dict[frozenset[str], float]:
    """Per link (its two end names), the larger of its two directions' transmit utilization between two
    polls of the controller's port statistics; rates maps (switch, port) to (peer, Mbit/s)."""
    before = {(row["switch"], row["port"]): row for row in previous}
    used: dict[frozenset[str], float] = {}
    for row in latest:
        key = (row["switch"], row["port"])
        if key not in rates or key not in before:
            continue
        seconds = row["time_s"] - before[key]["time_s"]
        sent = row["tx_bytes"] - before[key]["tx_bytes"]
        if seconds <= 0 or sent < 0:
            continue
        peer, mbps = rates[key]
        link = frozenset({row["switch"], peer})
        used[link] = max(used.get(link, 0.0), sent * 8 / seconds / 1e6 / mbps)
    return used


class LiveView:
    """The state the page shows, and the server that shows it. Bind it before anything runs: a taken
    port is a LiveError, with nothing started."""

    def __init__(self, spec_name: str, run_ids: list[str], port: int) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {"spec": spec_name, "runs": [{"run_id": r, "status": "pending"}
                                                                    for r in run_ids],
                                       "current": None, "fabric": None, "queues": [], "guard": None}
        self._fabric = None
        self._rates: dict[tuple[str, int], tuple[str, float]] = {}
        self._ports: list[dict] = []
        self._sampler = None
        self._queues_at_start: dict[tuple, int] = {}
        try:
            self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        except OSError as error:
            raise LiveError(f"--live: port {port} on 127.0.0.1 cannot be used ({error.strerror}); "
                            "pick another one") from None
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self.server.serve_forever, name="live-http", daemon=True),
                         threading.Thread(target=self._poll, name="live-poll", daemon=True)]

    def __enter__(self) -> LiveView:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        for thread in self._threads:
            thread.join()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    # -- what the runner tells it ------------------------------------------------------------------
    def fabric_up(self, fab, port_rates) -> None:
        with self._lock:
            self._fabric = fab
            self._rates = {(row.switch, int(row.port)): (row.peer, float(row.rate_mbps))
                           for row in port_rates.itertuples()}
            self._ports = []
            self._state["fabric"] = {**drawing(fab.topo.layout), "utilization": []}

    def fabric_down(self) -> None:
        with self._lock:
            self._fabric = None

    def sampling(self, sampler) -> None:
        """The run's FabricSampler (experiments/sampler.py), for queue drops and the guard."""
        with self._lock:
            self._sampler = sampler
            self._queues_at_start = {}

    def run_started(self, run_id: str, iterations: int, bound_s: float) -> None:
        with self._lock:
            self._set_status(run_id, "running")
            self._state["current"] = {"run_id": run_id, "iterations": iterations, "done": 0, "times": [],
                                      "bound_s": None if math.isnan(bound_s) else bound_s}

    def iteration(self, done: int, ends: list[float]) -> None:
        """`done` iterations finished, the last ones at `ends` (epoch seconds, in order)."""
        with self._lock:
            current = self._state["current"]
            if current is not None:
                current["done"] = done
                current["times"] = [b - a for a, b in zip(ends, ends[1:])]

    def job_iterations(self, jobs: dict[str, dict]) -> None:
        """A run of several jobs: name -> {"hosts": [...], "ends": [epoch seconds of its rank-0
        worker's finished iterations]}, in the run's job order."""
        with self._lock:
            current = self._state["current"]
            if current is not None:
                current["jobs"] = [{"name": name, "hosts": list(job["hosts"]), "done": len(job["ends"]),
                                    "times": [b - a for a, b in zip(job["ends"], job["ends"][1:])]}
                                   for name, job in jobs.items()]

    def run_ended(self, run_id: str, status: str) -> None:
        with self._lock:
            self._set_status(run_id, status)

    def _set_status(self, run_id: str, status: str) -> None:
        for run in self._state["runs"]:
            if run["run_id"] == run_id:
                run["status"] = status

    # -- serving -------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        with self._lock:
            return json.loads(json.dumps(self._state))

    def _poll(self) -> None:
        """Once a second: link utilization from the controller, queue drops and guard from the sampler."""
        while not self._stop.wait(POLL_S):
            with self._lock:
                fab, sampler = self._fabric, self._sampler
            ports = None
            if fab is not None:
                try:
                    ports = fab.rest("/fabric/ports", timeout=1)
                except (OSError, ValueError, urllib.error.URLError):
                    ports = None  # a restarting controller: the colours wait for it
            with self._lock:
                if ports is not None and self._state["fabric"] is not None:
                    used = utilization(self._ports, ports, self._rates) if self._ports else {}
                    self._state["fabric"]["utilization"] = [{"a": sorted(link)[0], "b": sorted(link)[1], "util": u}
                                                            for link, u in used.items()]
                    self._ports = ports
                if sampler is not None:
                    self._update_from(sampler.latest)

    def _update_from(self, latest: dict) -> None:
        queues = {(row[0], row[1], row[2]): row[5] for row in latest.get("queues", [])}
        if not self._queues_at_start:
            self._queues_at_start = dict(queues)
        start = self._queues_at_start
        drops = [{"switch": switch, "port": port, "cs": cs, "dropped": n - start.get((switch, port, cs), n)}
                 for (switch, port, cs), n in sorted(queues.items())]
        self._state["queues"] = [row for row in drops if row["dropped"] > 0]
        cpu = latest.get("cpu")
        if cpu is not None:
            from experiments.fidelity import CPU_LIMIT, VSWITCHD_THREAD_LIMIT
            self._state["guard"] = {"cpu": cpu[0], "cpu_limit": CPU_LIMIT, "vswitchd": cpu[1],
                                    "vswitchd_limit": VSWITCHD_THREAD_LIMIT, "at": time.time()}


def _handler(live: LiveView) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            allowed = {f"127.0.0.1:{live.port}", f"localhost:{live.port}"}
            if self.headers.get("Host") not in allowed:
                self._send(403, "application/json", b'{"error": "Host: only 127.0.0.1 or localhost"}')
            elif self.path == "/":
                self._send(200, "text/html; charset=utf-8", PAGE.read_bytes())
            elif self.path == "/state.json":
                self._send(200, "application/json", json.dumps(live.state()).encode())
            else:
                self._send(404, "application/json", b'{"error": "not found"}')

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # the terminal belongs to the progress bars
            pass

    return Handler
