"""Loopback benchmark of the host apps: `python -m hostapps.bench`.

Prints, for 4 processes on 127.0.0.1: ring all-reduce throughput (4 workers)
and parameter-server throughput (3 workers + 1 server) for 1, 4 and 16 MB
tensors with the CPU seconds each process spends per MB sent+received, and
the fraction of communication time hidden behind backprop, with the iteration
time, of a ResNet-50 profile job under each ordering policy (4 all-reduce
workers: ready, caramel, bytescheduler; 3 PS workers + 1 server: ready,
priority, tic, tac).  Loopback has no bandwidth limit, so orders differ little
there unless --transport mlt paces sends at --link-mbps.  At 100 Mbit/s a host moves at most 12.5 MB/s each way, so the
host apps keep the link saturated while CPU s/MB stays well below 1/25 s.
"""
import argparse
import multiprocessing
import time
from types import SimpleNamespace

import numpy as np

from hostapps.collectives import PS_PULL, PS_PUSH, ring_allreduce, ring_neighbours
from hostapps.config import Model, ProcessConfig
from hostapps.model import FlatModel
from hostapps.records import Recorder, comm_busy_s
from hostapps.server import ParameterShard, run_server
from hostapps.transport import MessageKey, Peer, free_loopback_addresses
from hostapps.assembly import connect_transport
from hostapps.worker import run_worker

PROCESSES = 4
PS_TENSORS = 4  # a PS message is split into this many tensors, as layers would be


def _bench_model(nbytes: int) -> FlatModel:
    size = nbytes // 4 // PS_TENSORS
    return FlatModel([SimpleNamespace(name=f"t{i}", size=size) for i in range(PS_TENSORS)])


def _measure(cfg: ProcessConfig, nbytes: int, rounds: int, one_round) -> dict:
    """Run one warm-up round then `rounds` timed ones (no message above nbytes); wall and CPU seconds, payload
    bytes moved."""
    recorder = Recorder(0, cfg.role, cfg.rank)
    transport = connect_transport(cfg, recorder, nbytes)
    state = one_round(transport, None, 0)
    recorder.messages.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    for r in range(1, rounds + 1):
        one_round(transport, state, r)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    transport.close()
    return dict(wall=wall, cpu=cpu, bytes=sum(m.nbytes for m in recorder.messages))


def _allreduce_process(cfg: ProcessConfig, nbytes: int, rounds: int, results) -> None:
    left, right = ring_neighbours(cfg.rank, cfg.world)

    def one_round(transport, state, r):
        flat, scratch = state or (np.ones(nbytes // 4, dtype=np.float32),
                                  np.empty(nbytes // 4 // cfg.world + 1, np.float32))
        ring_allreduce(transport, left, right, cfg.rank, cfg.world, r, 0, flat, scratch)
        return flat, scratch
    results.put(_measure(cfg, nbytes, rounds, one_round))


def _ps_process(cfg: ProcessConfig, nbytes: int, rounds: int, results) -> None:
    model = _bench_model(nbytes)
    server = Peer("server", 0)

    def serve(transport, state, r):
        shard = state or ParameterShard(cfg, transport, model, Recorder(0, "server", 0))
        shard.serve_iteration(r)
        return shard

    def push_pull(transport, state, r):
        for t in reversed(range(PS_TENSORS)):
            transport.send(server, MessageKey(r, t, PS_PUSH), model.layer_grads(t), tolerate_loss=True)
        for t in range(PS_TENSORS):
            transport.recv(server, MessageKey(r, t, PS_PULL), out=model.layer_params(t))
        return True
    results.put(_measure(cfg, nbytes, rounds, serve if cfg.role == "server" else push_pull))


def _run_processes(targets, expected: int | None = None) -> list[dict]:
    """Run each target in a process; collect `expected` results (one per process by default)."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    procs = [context.Process(target=target, args=(*args, results)) for target, args in targets]
    for p in procs:
        p.start()
    found = [results.get(timeout=300) for _ in range(len(procs) if expected is None else expected)]
    for p in procs:
        p.join(30)
    return found


def _throughput(found: list[dict], nbytes: int, rounds: int) -> dict:
    """Per-round time of the slowest process, tensor MB/s, and CPU s per MB sent+received (all processes)."""
    wall = max(f["wall"] for f in found) / rounds
    return dict(seconds=wall, mb_per_s=nbytes / wall / 1e6,
                cpu_s_per_mb=sum(f["cpu"] for f in found) / (sum(f["bytes"] for f in found) / 1e6))


def bench_allreduce(nbytes: int, rounds: int) -> dict:
    addrs = free_loopback_addresses(PROCESSES)
    found = _run_processes([(_allreduce_process, (ProcessConfig(role="worker", rank=r, workers=addrs, timeout=60),
                                                  nbytes, rounds)) for r in range(PROCESSES)])
    return _throughput(found, nbytes, rounds)


def bench_ps(nbytes: int, rounds: int) -> dict:
    addrs = free_loopback_addresses(PROCESSES)
    workers, servers = addrs[:PROCESSES - 1], addrs[PROCESSES - 1:]

    def cfg(role, rank):
        return ProcessConfig(role=role, rank=rank, workers=workers, servers=servers, mode="ps", lr=1e-3, timeout=60)
    found = _run_processes([(_ps_process, (cfg("worker", r), nbytes, rounds)) for r in range(len(workers))]
                           + [(_ps_process, (cfg("server", 0), nbytes, rounds))])
    return _throughput(found, nbytes, rounds)


def _overlap_process(cfg: ProcessConfig, results) -> None:
    if cfg.role == "server":
        run_server(cfg)
        return
    summary = run_worker(cfg)
    recorder = summary["recorder"]
    rows = recorder.iterations[1:]  # iteration 0 has no previous communication to wait for
    results.put(dict(wait=sum(r["wait_s"] for r in rows),
                     busy=sum(comm_busy_s(recorder.messages, r["iteration"] - 1) for r in rows),
                     iteration_s=sum(r["end_s"] - r["start_s"] for r in rows) / len(rows)))


def bench_overlap(iterations: int, mode: str = "allreduce", send_order: str = "ready", **options) -> dict:
    """Fraction of communication hidden behind compute: 1 - exposed wait / communication busy time."""
    addrs = free_loopback_addresses(PROCESSES)
    servers = addrs[PROCESSES - 1:] if mode == "ps" else []
    workers = addrs[:PROCESSES - len(servers)]

    def cfg(role, rank):
        return ProcessConfig(role=role, rank=rank, workers=workers, servers=servers, mode=mode,
                             send_order=send_order, model=Model("resnet50", scale=0.01), iterations=iterations,
                             batch=60, eval_every=0, timeout=60, **options)
    found = _run_processes([(_overlap_process, (cfg("worker", r),)) for r in range(len(workers))]
                           + [(_overlap_process, (cfg("server", s),)) for s in range(len(servers))],
                           expected=len(workers))
    wait, busy = sum(f["wait"] for f in found), sum(f["busy"] for f in found)
    return dict(hidden=max(0.0, 1.0 - wait / busy) if busy else 1.0,
                iteration_s=np.mean([f["iteration_s"] for f in found]),
                comm_s=busy / len(found) / (iterations - 1), wait_s=wait / len(found) / (iterations - 1))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m hostapps.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=8, help="iterations of the overlap jobs")
    parser.add_argument("--link-mbps", type=float, default=100.0,
                        help="emulated link rate: profile compute scaling, and mlt's send pacing")
    parser.add_argument("--transport", default="tcp", help="tcp, or mlt (paces sends at --link-mbps)")
    parser.add_argument("--orders-only", action="store_true", help="skip the throughput table")
    args = parser.parse_args()
    print(f"host apps on loopback, {PROCESSES} processes")
    print(f'{"collective":<34} {"ms/round":>10} {"tensor MB/s":>12} {"CPU s/MB":>10}')
    for mb in () if args.orders_only else (1, 4, 16):
        for name, bench in (("ring all-reduce, 4 workers", bench_allreduce), ("PS, 3 workers + 1 server", bench_ps)):
            r = bench(mb * 1000 * 1000, args.rounds)
            label = f"{name}, {mb:2d} MB"
            print(f"{label:<34} {r['seconds'] * 1e3:10.1f} {r['mb_per_s']:12.1f} {r['cpu_s_per_mb']:10.5f}")
    print(f"ResNet-50 profile, scale 0.01, {args.transport} at {args.link_mbps:g} Mbit/s: "
          "overlap = share of communication hidden behind compute")
    print(f'{"mode, send order":<34} {"iteration ms":>12} {"comm ms":>10} {"wait ms":>10} {"overlap":>10}')
    for mode, orders in (("allreduce", ("ready", "caramel", "bytescheduler")),
                         ("ps", ("ready", "priority", "tic", "tac"))):
        for order in orders:
            r = bench_overlap(args.iterations, mode, order, link_mbps=args.link_mbps, transport=args.transport)
            label = f"{'4-worker all-reduce' if mode == 'allreduce' else '3 workers + PS'}, {order}"
            print(f"{label:<34} {r['iteration_s'] * 1e3:12.1f} {r['comm_s'] * 1e3:10.1f} {r['wait_s'] * 1e3:10.1f} "
                  f"{100 * r['hidden']:9.0f}%")
    print("link budget: at 100 Mbit/s a host moves <= 25 MB/s sent+received, i.e. needs < 0.04 CPU s/MB")


if __name__ == "__main__":
    main()
