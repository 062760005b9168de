"""In-process helpers: free ports, threads that re-raise, TCP meshes and whole training jobs on
loopback (every process of a job as a thread)."""
from __future__ import annotations

import socket
import threading

from hostapps.config import ProcessConfig
from hostapps.server import run_server
from hostapps.transport import TcpTransport
from hostapps.worker import run_worker

# mlt on loopback, which has no link rate: paced at 10 Gbit/s, not at the default 100 Mbit/s, and in
# 1400-byte fragments (as at MTU 1500), so that the tests' small messages are many datagrams.
LOOPBACK_MLT = dict(link_mbps=10000, mtu_payload=1400)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_threads(targets):
    """Run callables in threads; re-raise the first exception."""
    errors = []

    def guard(target):
        try:
            target()
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=guard, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]


def connect_mesh(peers, addresses, timeout=5.0, make=TcpTransport):
    """Fully connected transports made by make(peer, address, tag, timeout): the lower index dials."""
    transports = [make(p, a, 0, timeout) for p, a in zip(peers, addresses)]

    def connect(i):
        dial = {peers[j]: addresses[j] for j in range(i + 1, len(peers))}
        accept = {peers[j]: addresses[j] for j in range(i)}
        return lambda: transports[i].connect(dial, accept)
    run_threads([connect(i) for i in range(len(peers))])
    return transports


def run_job(addresses, workers, mode="allreduce", shards=0, **options):
    """Run every process of a job as a thread; return the worker summaries by rank."""
    addrs = addresses(workers + shards)
    results, errors = {}, []

    def run(role, rank):
        cfg = ProcessConfig(role=role, rank=rank, workers=addrs[:workers], servers=addrs[workers:], mode=mode,
                        timeout=10.0, **options)
        try:
            results[(role, rank)] = (run_worker if role == "worker" else run_server)(cfg)
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=run, args=("worker", r)) for r in range(workers)]
    threads += [threading.Thread(target=run, args=("server", s)) for s in range(shards)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return [results[("worker", r)] for r in range(workers)]
