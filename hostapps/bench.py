"""Loopback benchmark of the host apps: `python -m hostapps.bench`.

Prints, for 4 processes on 127.0.0.1: ring all-reduce throughput (4 workers)
and parameter-server throughput (3 workers + 1 server) for 1, 4 and 16 MB
tensors with the CPU seconds each process spends per MB sent+received, and
the fraction of communication time hidden behind backprop in a ResNet-50
profile job.  At 100 Mbit/s a host moves at most 12.5 MB/s each way, so the
host apps keep the link saturated while CPU s/MB stays well below 1/25 s.
"""
import argparse
import multiprocessing
import time
from types import SimpleNamespace

import numpy as np

from hostapps.collectives import PS_PULL, PS_PUSH, ring_allreduce, ring_neighbours
from hostapps.config import RunConfig
from hostapps.model import FlatModel
from hostapps.records import Recorder, comm_busy_s
from hostapps.server import ParameterShard
from hostapps.transport import MessageKey, Peer, free_loopback_addresses
from hostapps.worker import connect_transport, run_worker

PROCESSES = 4
PS_TENSORS = 4  # a PS message is split into this many tensors, as layers would be


def _bench_model(nbytes: int) -> FlatModel:
    size = nbytes // 4 // PS_TENSORS
    return FlatModel([SimpleNamespace(name="t%d" % i, size=size) for i in range(PS_TENSORS)])


def _measure(cfg: RunConfig, rounds: int, one_round) -> dict:
    """Run one warm-up round then `rounds` timed ones; wall and CPU seconds, payload bytes moved."""
    recorder = Recorder(0, cfg.role, cfg.rank)
    transport = connect_transport(cfg, recorder)
    state = one_round(transport, None, 0)
    recorder.messages.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    for r in range(1, rounds + 1):
        one_round(transport, state, r)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    transport.close()
    return dict(wall=wall, cpu=cpu, bytes=sum(m[3] for m in recorder.messages))


def _allreduce_process(cfg: RunConfig, nbytes: int, rounds: int, results) -> None:
    left, right = ring_neighbours(cfg.rank, cfg.world)

    def one_round(transport, state, r):
        flat, scratch = state or (np.ones(nbytes // 4, dtype=np.float32), np.empty(nbytes // 4 // cfg.world + 1, np.float32))
        ring_allreduce(transport, left, right, cfg.rank, cfg.world, r, 0, flat, scratch)
        return flat, scratch
    results.put(_measure(cfg, rounds, one_round))


def _ps_process(cfg: RunConfig, nbytes: int, rounds: int, results) -> None:
    model = _bench_model(nbytes)
    server = Peer("server", 0)

    def serve(transport, state, r):
        shard = state or ParameterShard(cfg, transport, model, Recorder(0, "server", 0))
        shard.serve_iteration(r)
        return shard

    def push_pull(transport, state, r):
        for t in reversed(range(PS_TENSORS)):
            transport.send(server, MessageKey(r, t, PS_PUSH), model.layer_grads(t))
        for t in range(PS_TENSORS):
            transport.recv(server, MessageKey(r, t, PS_PULL), out=model.layer_params(t))
        return True
    results.put(_measure(cfg, rounds, serve if cfg.role == "server" else push_pull))


def _run_processes(targets) -> list[dict]:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    procs = [context.Process(target=target, args=(*args, results)) for target, args in targets]
    for p in procs:
        p.start()
    found = [results.get(timeout=300) for _ in procs]
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
    found = _run_processes([(_allreduce_process, (RunConfig(role="worker", rank=r, workers=addrs, timeout=60),
                                                  nbytes, rounds)) for r in range(PROCESSES)])
    return _throughput(found, nbytes, rounds)


def bench_ps(nbytes: int, rounds: int) -> dict:
    addrs = free_loopback_addresses(PROCESSES)
    workers, servers = addrs[:PROCESSES - 1], addrs[PROCESSES - 1:]

    def cfg(role, rank):
        return RunConfig(role=role, rank=rank, workers=workers, servers=servers, mode="ps", lr=1e-3, timeout=60)
    found = _run_processes([(_ps_process, (cfg("worker", r), nbytes, rounds)) for r in range(len(workers))]
                           + [(_ps_process, (cfg("server", 0), nbytes, rounds))])
    return _throughput(found, nbytes, rounds)


def _overlap_process(cfg: RunConfig, results) -> None:
    summary = run_worker(cfg)
    recorder = summary["recorder"]
    rows = recorder.iterations[1:]  # iteration 0 has no previous communication to wait for
    results.put(dict(wait=sum(r["wait_s"] for r in rows),
                     busy=sum(comm_busy_s(recorder.messages, r["iteration"] - 1) for r in rows),
                     iteration_s=sum(r["end_s"] - r["start_s"] for r in rows) / len(rows)))


def bench_overlap(iterations: int) -> dict:
    """Fraction of communication hidden behind compute: 1 - exposed wait / communication busy time."""
    addrs = free_loopback_addresses(PROCESSES)
    found = _run_processes([(_overlap_process, (RunConfig(
        role="worker", rank=r, workers=addrs, profile="resnet50", scale=0.01, iterations=iterations,
        eval_every=0, timeout=60),)) for r in range(PROCESSES)])
    wait, busy = sum(f["wait"] for f in found), sum(f["busy"] for f in found)
    return dict(hidden=max(0.0, 1.0 - wait / busy) if busy else 1.0, iteration_s=np.mean([f["iteration_s"] for f in found]),
                comm_s=busy / len(found) / (iterations - 1), wait_s=wait / len(found) / (iterations - 1))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m hostapps.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=8, help="iterations of the overlap job")
    args = parser.parse_args()
    print("host apps on loopback, %d processes" % PROCESSES)
    print("%-34s %10s %12s %10s" % ("collective", "ms/round", "tensor MB/s", "CPU s/MB"))
    for mb in (1, 4, 16):
        for name, bench in (("ring all-reduce, 4 workers", bench_allreduce), ("PS, 3 workers + 1 server", bench_ps)):
            r = bench(mb * 1000 * 1000, args.rounds)
            print("%-34s %10.1f %12.1f %10.5f" % ("%s, %2d MB" % (name, mb), r["seconds"] * 1e3, r["mb_per_s"],
                                                  r["cpu_s_per_mb"]))
    overlap = bench_overlap(args.iterations)
    print("overlap (ResNet-50 profile, scale 0.01, 4-worker all-reduce): %.0f%% of communication hidden "
          "(comm %.1f ms, exposed wait %.1f ms, iteration %.1f ms)" % (
              100 * overlap["hidden"], overlap["comm_s"] * 1e3, overlap["wait_s"] * 1e3, overlap["iteration_s"] * 1e3))
    print("link budget: at 100 Mbit/s a host moves <= 25 MB/s sent+received, i.e. needs < 0.04 CPU s/MB")


if __name__ == "__main__":
    main()
