"""Collectives over real TCP transports on loopback, one thread per rank."""
import socket

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from hostapps import codec
from hostapps.collectives import PS_PULL, PS_PUSH, ring_allreduce, ring_neighbours
from hostapps.config import Model, ProcessConfig, build_model
from hostapps.records import Recorder
from hostapps.server import ParameterShard
from hostapps.transport import MessageKey, Peer, TcpTransport, TransportError

from helpers.loopback import connect_mesh, run_threads


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=st.integers(1, 4), size=st.integers(0, 3000), seed=st.integers(0, 2**16))
def test_ring_allreduce_is_the_mean(loopback_addresses, world, size, seed):
    peers = [Peer("worker", r) for r in range(world)]
    transports = connect_mesh(peers, loopback_addresses(world))
    rng = np.random.default_rng(seed)
    inputs = [rng.normal(size=size).astype(np.float32) for _ in range(world)]
    arrays = [x.copy() for x in inputs]

    def reduce(rank):
        left, right = ring_neighbours(rank, world)
        scratch = np.empty(size // world + 1, dtype=np.float32)
        return lambda: [ring_allreduce(transports[rank], left, right, rank, world, it, 3, arrays[rank], scratch)
                        for it in range(2)]  # twice: the second round reduces the already-equal means
    try:
        run_threads([reduce(r) for r in range(world)])
    finally:
        run_threads([t.close for t in transports])
    expected = np.mean(inputs, axis=0)
    for a in arrays:
        np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(arrays[0], a) for a in arrays)


def test_parameter_server_averages_and_steps(loopback_addresses):
    world, lr = 3, 0.5
    addresses = loopback_addresses(world + 1)
    cfg = ProcessConfig(role="server", rank=0, workers=addresses[:world], servers=addresses[world:], mode="ps",
                    model=Model(width=16, depth=1), iterations=1, batch=3, lr=lr, timeout=5.0)
    model = build_model(cfg)
    initial = model.params.copy()
    workers = [Peer("worker", r) for r in range(world)]
    server = Peer("server", 0)
    transports = connect_mesh([server] + workers, addresses[world:] + addresses[:world])
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=model.params.size).astype(np.float32) for _ in range(world)]
    pulled = [np.empty_like(model.params) for _ in range(world)]
    shard = ParameterShard(cfg, transports[0], model, Recorder(0, "server", 0))
    assert shard.tensors == list(range(len(model.layers)))

    def worker(rank):
        def run():
            for t in reversed(range(len(model.layers))):
                transports[rank + 1].send(server, MessageKey(0, t, PS_PUSH), grads[rank][model.layer_slice((t,))])
            for t in range(len(model.layers)):
                transports[rank + 1].recv(server, MessageKey(0, t, PS_PULL), out=pulled[rank][model.layer_slice((t,))])
        return run
    try:
        run_threads([lambda: shard.serve_iteration(0)] + [worker(r) for r in range(world)])
        shard.close()
    finally:
        run_threads([t.close for t in transports])
    expected = initial - lr * np.mean(grads, axis=0)
    for p in pulled:
        np.testing.assert_allclose(p, expected, rtol=1e-5, atol=1e-6)


def test_malformed_frame_fails_the_peer_with_an_error(loopback_addresses):
    me, intruder = Peer("worker", 0), Peer("worker", 1)
    address, _ = loopback_addresses(2)
    transport = TcpTransport(me, address, 0, 3.0)
    raw = socket.create_connection(address)
    raw.sendall(codec.encode_header(codec.Frame(codec.KIND_HELLO, "worker", 1, 0, 0, 0, 0, 0, 0, 0)))
    transport.connect({}, {intruder: ("127.0.0.1", 1)})
    raw.sendall(b"\x00" * codec.HEADER.size)
    with pytest.raises(TransportError, match="malformed frame.*bad magic"):
        transport.recv(intruder, MessageKey(0, 0, 0), out=np.empty(4, dtype=np.float32))
    raw.close()
    transport.close()


def test_garbled_hello_is_refused_and_the_missing_peer_named(loopback_addresses, capsys):
    address, _ = loopback_addresses(2)
    transport = TcpTransport(Peer("server", 0), address, 0, 1.0)
    raw = socket.create_connection(address)
    raw.sendall(b"GET / HTTP/1.0\r\n" + b"x" * 64)
    with pytest.raises(TransportError, match=r"worker0 \(127.0.0.1:1\) never connected within 1.0 s"):
        transport.connect({}, {Peer("worker", 0): ("127.0.0.1", 1)})
    assert "rejected connection" in capsys.readouterr().out
    raw.close()
    transport.abort()
