"""How long one REST request can hold the controller: `python -m controller.bench`.

The controller is one OS thread of green threads: while a request parses or changes state it
holds the OpenFlow side (echoes, barriers, packet-ins). Each request below is sent in-process
through the real WSGI stack of the real app (no switch attached) while a ticker green thread
measures the longest stretch it could not run. The bodies are the worst cases of every stage
for their size (the JSON shape scan, json.loads, the schema engine, the registration), at the
largest size allowed, plus the largest valid job and classes body. Exits 1 when any request holds
the controller longer than the budget.

Last, a client floods the server over real sockets (another process, GET /jobs as fast as it is
answered) while the same ticker runs: most of its requests are refused 429 at accept
(rest.ClientGuard), and the OpenFlow side must not wait longer than the budget either.
"""
from __future__ import annotations

import controller.manager  # noqa: F401  (the eventlet shim, before ryu.app.wsgi)

import argparse
import collections
import gc
import json
import socket
import subprocess
import sys
import time
from typing import Callable

import webob
from ryu.lib import hub

from controller.app import FabricController
from controller.priority import MAX_FLOWS
from controller.rest import (MAX_BODY_BYTES, MAX_JSON_CONTAINERS, MAX_JSON_MEMBERS,
                             MAX_JSON_VALUES, ClientGuard, serve)
from controller.scheduling import MAX_LAYERS

BUDGET_S = 0.05
SIZE = MAX_BODY_BYTES - 64


def fill(start: str, unit: str, end: str) -> str:
    """start, then unit as often as fits in SIZE bytes with end."""
    return start + unit * ((SIZE - len(start) - len(end)) // len(unit)) + end


def worst_bodies() -> dict[str, bytes]:
    """Bodies that make each stage of a request work hardest, each at most MAX_BODY_BYTES."""
    hosts = [f"10.0.0.{i}" for i in range(1, 65)]
    job = {"job": "big", "policy": "tictac", "hosts": hosts,
           "layers": [{"index": i, "name": f"layer{i}", "bytes": 1000 + i, "fwd_ms": 0.5}
                      for i in range(MAX_LAYERS)],
           "flows": [{"layers": [i], "src": hosts[i % 64], "dst": hosts[(i + 1) % 64],
                      "proto": "tcp", "dport": 1 + i} for i in range(MAX_FLOWS)]}
    texts = {
        "unterminated escaped quotes": fill('{"job": "', '\\"', ""),
        "backslashes": fill('{"job": "', "\\\\", '"}'),
        "quotes": fill("", '"', ""),
        "open brackets": fill("", "[", ""),
        "deep balanced": "[" * (SIZE // 2) + "]" * (SIZE // 2),
        "empty arrays": fill("[", "[],", "[]]"),
        "arrays at the limit, then numbers": fill("[" + "[]," * (MAX_JSON_CONTAINERS - 1), "1,",
                                                  "1]"),
        "slow numbers at the limit": "[" + "1e308," * (MAX_JSON_VALUES - 1) + "1e308]",
        "distinct keys at the limit": "{" + ",".join(f'"{i}":1' for i in range(MAX_JSON_MEMBERS))
                                      + "}",
        "long string": fill('{"job": "', "x", '"}'),
        "unicode escapes": fill('{"job": "', "\\u00e9", '"}'),
        "largest valid job": json.dumps(job),
    }
    return {name: text.encode()[:SIZE] for name, text in texts.items()}


def longest_hold(action: Callable[[], object]) -> float:
    """Seconds of the longest stretch `action` ran without letting another green thread run."""
    gaps, done = [], []

    def tick():
        while not done:
            start = time.perf_counter()
            hub.sleep(0)
            gaps.append(time.perf_counter() - start)

    ticker = hub.spawn(tick)
    hub.sleep(0)
    action()
    done.append(True)
    ticker.wait()
    return max(gaps)


# The flooding client: GET /jobs over a new connection each time, for argv[2] seconds; prints the
# count of each status ("reset": the server closed before answering).
FLOOD_CLIENT = """
import collections, json, socket, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
request = f"GET /jobs HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\n\\r\\n".encode()
statuses, end = collections.Counter(), time.monotonic() + seconds
while time.monotonic() < end:
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        statuses[answer[9:12].decode() or "closed"] += 1
    except OSError:
        statuses["reset"] += 1
print(json.dumps(statuses))
"""


def flood(app: FabricController, seconds: float = 2.0,
          guard: ClientGuard | None = None) -> tuple[float, dict[str, int]]:
    """The longest hold while a client process floods the app's REST server (`guard`: its
    ClientGuard, the default's if None), and the count of each status the client got."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = serve(app.wsgi, "127.0.0.1", port, guard=guard)
    client = subprocess.Popen([sys.executable, "-c", FLOOD_CLIENT, str(port), str(seconds)],
                              stdout=subprocess.PIPE, text=True)

    def wait() -> None:
        while client.poll() is None:
            hub.sleep(0.005)

    try:
        held = longest_hold(wait)
    finally:
        hub.kill(server)
    return held, collections.Counter(json.loads(client.stdout.read()))


def request(method: str, path: str, body: bytes | None = None) -> webob.Request:
    req = webob.Request.blank(path, method=method, body=body, base_url="http://127.0.0.1:8080")
    if body is not None:
        req.headers["Content-Type"] = "application/json"
    return req


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-ms", type=float, default=BUDGET_S * 1000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each request (the worst is shown)")
    parser.add_argument("--flood-s", type=float, default=2.0, help="seconds of the flood")
    args = parser.parse_args(argv)
    app = FabricController()
    for thread in app.threads:  # no Ryu app manager: the probe and statistics loops stay off
        hub.kill(thread)
    gc.collect()
    gc.freeze()  # as the controller does once it has started
    cases = [(name, request("POST", path, body)) for name, body in worst_bodies().items()
             for path in ("/jobs", "/fabric/classes")]
    cases += [("delete the largest job", request("DELETE", "/jobs/big")),
              ("list jobs", request("GET", "/jobs"))]
    worst = 0.0
    print(f"{'request':52} {'bytes':>8} {'status':>6} {'held (ms)':>10}")
    for name, req in cases:
        held, status = 0.0, None
        for _ in range(args.repeat):
            copy = req.copy()
            answer = []
            held = max(held, longest_hold(lambda: answer.append(copy.get_response(app.wsgi))))
            status = status or answer[0].status_int
        worst = max(worst, held)
        label = f"{req.method} {req.path} {name}"
        print(f"{label:52} {len(req.body):8} {status:6} {held * 1000:10.1f}")
    held, statuses = flood(app, args.flood_s)
    worst = max(worst, held)
    counts = ", ".join(f"{status} x{n}" for status, n in sorted(statuses.items()))
    print(f"{f'flood: GET /jobs for {args.flood_s:g} s ({counts})':68} {held * 1000:10.1f}")
    verdict = "within" if worst * 1000 <= args.budget_ms else "OVER"
    print(f"longest hold {worst * 1000:.1f} ms: {verdict} the budget of {args.budget_ms:.0f} ms")
    return 0 if verdict == "within" else 1


if __name__ == "__main__":
    sys.exit(main())
