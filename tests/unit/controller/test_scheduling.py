"""Gradient-aware scheduling: policies' DSCP per layer, job document validation, the flow
rewrites of a job, port ranges as masked matches, and the /jobs REST API of a real controller."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest
from hypothesis import given, strategies as st

import controller.scheduling as scheduling
from controller.priority import MAX_FLOWS, FlowClass, port_range_blocks
from common.classes import DROPPABLE_DSCP, GRADIENT_DSCPS
from controller.scheduling import (CLASS_POLICIES, MAX_LAYERS, ClassPolicy, Layer, job_flow_classes, job_mark_count,
                                   layer_dscps, parse_job, rank_to_class, ranks_by, register)
from helpers import REPO
from common.schema import SchemaError
from helpers.loopback import free_port
from emulation.fabric import Fabric

CS6, CS5, CS4, CS3, CS2 = GRADIENT_DSCPS
# index, bytes, fwd_ms: layers 1 and 4 take no forward time (e.g. a flatten, a dropout).
TABLE = [(0, 100, 1.0), (1, 5000, 0.0), (2, 20, 2.0), (3, 800, 3.0), (4, 10, 0.0), (5, 3000, 1.0)]
LAYERS = [Layer(i, f"l{i}", b, f) for i, b, f in TABLE]
HOSTS = ["10.0.0.1", "10.0.0.3"]


def job_doc(**changes) -> dict:
    doc = {"job": "j1", "policy": "layer", "hosts": HOSTS,
           "layers": [{"index": i, "name": f"l{i}", "bytes": b, "fwd_ms": f} for i, b, f in TABLE],
           "flows": [{"layer": 0, "src": HOSTS[0], "dst": HOSTS[1], "proto": "tcp", "dport": 5001},
                     {"layers": [4, 5], "src": HOSTS[1], "dst": HOSTS[0], "proto": "udp",
                      "dport_range": [6000, 6009]}]}
    return {**doc, **changes}


# -- policies -------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy, expected", [
    ("fifo", [0, 0, 0, 0, 0, 0]),
    ("layer", [CS6, CS5, CS4, CS3, CS2, CS2]),  # 6 layers in 5 classes: the back two share
    ("tictac", [CS6, CS6, CS6, CS4, CS2, CS2]),  # needed at 0, 1, 1, 3, 6, 6 of 7 ms: fifths 0, 0, 0, 2, 4, 4
    ("size", [CS4, CS2, CS5, CS3, CS6, CS2]),  # 10 < 20 < 100 < 800 < 3000 < 5000 bytes
])
def test_policy_classes_of_a_six_layer_table(policy, expected):
    dscps = layer_dscps(policy, LAYERS)
    assert [dscps[i] for i in range(6)] == expected


def test_tictac_classes_split_the_forward_time_where_layer_splits_the_layer_count():
    # A slow stem then eleven quick layers (ResNet's conv1 before its blocks): needed at 0, 10,
    # 11, ..., 20 of 21 ms. The stem's 10 ms are half the pass, so every later layer is needed
    # in the last three fifths (from 8.4 ms, 12.6 ms and 16.8 ms on).
    layers = [Layer(i, f"l{i}", 100, 10.0 if i == 0 else 1.0) for i in range(12)]
    tictac, layer = layer_dscps("tictac", layers), layer_dscps("layer", layers)
    assert [tictac[i] for i in range(12)] == [CS6] + [CS4] * 3 + [CS3] * 4 + [CS2] * 4
    assert [layer[i] for i in range(12)] == [CS6] * 2 + [CS5] * 2 + [CS4] * 2 + [CS3] * 3 + [CS2] * 3


@pytest.mark.parametrize("fwd_ms", [None, 0.0])
def test_tictac_without_forward_times_is_the_forward_order(fwd_ms):
    untimed = [Layer(i, f"l{i}", b, fwd_ms) for i, b, _ in TABLE]
    assert layer_dscps("tictac", untimed) == layer_dscps("layer", untimed)
    shuffled = [untimed[i] for i in (3, 0, 5, 1, 4, 2)]
    assert layer_dscps("layer", shuffled) == layer_dscps("layer", untimed), "by index, not position"
    assert layer_dscps("tictac", [LAYERS[i] for i in (3, 0, 5, 1, 4, 2)]) == layer_dscps("tictac", LAYERS)


def test_registry_and_adding_a_policy(monkeypatch):
    assert sorted(CLASS_POLICIES) == ["fifo", "layer", "size", "tictac"]
    monkeypatch.setattr(scheduling, "CLASS_POLICIES", dict(CLASS_POLICIES))

    @register
    class BackFirst(ClassPolicy):
        name = "back"

        def ranks(self, layers):
            return ranks_by(layers, lambda layer: -layer.index)

    assert scheduling.CLASS_POLICIES["back"] is BackFirst
    dscps = layer_dscps("back", LAYERS[:3])
    assert [dscps[i] for i in range(3)] == [CS4, CS5, CS6]
    assert parse_job(job_doc(policy="back")).policy == "back"


@given(st.integers(1, 300), st.integers(1, 8))
def test_rank_to_class_groups_in_order(ranks, classes):
    got = [rank_to_class(r, ranks, classes) for r in range(ranks)]
    assert got[0] == 0 and got == sorted(got), "most urgent first, order kept"
    assert set(got) == set(range(min(ranks, classes))), "every class used, none beyond"
    sizes = [got.count(c) for c in set(got)]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes), "even, finer at the front"


# -- port ranges ----------------------------------------------------------------------------------
@given(st.integers(0, 65535), st.integers(0, 65535), st.integers(0, 65535))
def test_port_range_blocks_match_exactly_the_range(a, b, probe):
    lo, hi = min(a, b), max(a, b)
    blocks = port_range_blocks(lo, hi)
    for value, mask in blocks:
        assert value & mask == value, "aligned: the value has no bits outside its mask"
    in_range = [p for p in (lo, hi, probe, lo - 1, hi + 1) if 0 <= p <= 65535]
    for port in in_range:
        hits = sum(port & mask == value for value, mask in blocks)
        assert hits == (1 if lo <= port <= hi else 0), (port, blocks)
    assert len(blocks) <= 2 * 16


def test_port_range_blocks_examples():
    assert port_range_blocks(6000, 6000) == [(6000, 0xFFFF)]
    assert port_range_blocks(6000, 6015) == [(6000, 0xFFF0)]
    assert port_range_blocks(6000, 6009) == [(6000, 0xFFF8), (6008, 0xFFFE)]
    assert port_range_blocks(0, 65535) == [(0, 0)]
    with pytest.raises(ValueError):
        port_range_blocks(10, 9)


# -- a job's rewrites ---------------------------------------------------------------------------
def test_job_flow_classes():
    classes = job_flow_classes(parse_job(job_doc()))
    a, b = HOSTS
    assert classes == [
        FlowClass(a, b, CS6, "tcp", None, 5001),
        FlowClass(b, a, CS2, "udp", None, 6000, 0xFFF8),  # layers 4 and 5, both CS2
        FlowClass(b, a, CS2, "udp", None, 6008, 0xFFFE),
        FlowClass(a, None, DROPPABLE_DSCP, in_dscp=1),
        FlowClass(b, None, DROPPABLE_DSCP, in_dscp=1),
    ]
    assert len({f.match_key() for f in classes}) == len(classes)


def test_a_connection_carrying_every_layer_gets_the_most_urgent_class():
    flows = [{"src": HOSTS[0], "dst": HOSTS[1], "proto": "tcp"}]
    (flow, *_) = job_flow_classes(parse_job(job_doc(flows=flows, policy="size")))
    assert flow == FlowClass(HOSTS[0], HOSTS[1], CS6, "tcp")
    (flow, *_) = job_flow_classes(parse_job(job_doc(flows=flows, policy="fifo")))
    assert flow.dscp == 0


# -- job document validation ----------------------------------------------------------------------
def layer_doc(**changes) -> dict:
    return {"index": 0, "name": "l0", "bytes": 100, **changes}


def flow_doc(**changes) -> dict:
    return {"layer": 0, "src": HOSTS[0], "dst": HOSTS[1], "proto": "udp", **changes}


@pytest.mark.parametrize("changes, field", [
    ({"jobs": "x"}, "jobs"),
    ({"job": ""}, "job"), ({"job": 7}, "job"), ({"job": "a/b"}, "job"), ({"job": "x\n"}, "job"),
    ({"job": "\u0100"}, "job"), ({"job": "é"}, "job"), ({"job": "x" * 65}, "job"), ({"job": "x" * 9000}, "job"),
    ({"job": "."}, "job"), ({"job": ".."}, "job"), ({"job": "-x"}, "job"), ({"job": "a b"}, "job"),
    ({"job": "a%0A"}, "job"), ({"job": "ｘ"}, "job"),
    ({"policy": "p3"}, "policy"), ({"policy": None}, "policy"), ({"policy": ["x"]}, "policy"),
    ({"hosts": []}, "hosts"), ({"hosts": "10.0.0.1"}, "hosts"), ({"hosts": ["h1"]}, "hosts.0"),
    ({"layers": []}, "layers"), ({"layers": [5]}, "layers.0"),
    ({"layers": [layer_doc(), layer_doc()]}, "layers.1.index"),
    ({"layers": [layer_doc(index=-1)]}, "layers.0.index"),
    ({"layers": [layer_doc(index=True)]}, "layers.0.index"),
    ({"layers": [layer_doc(name="")]}, "layers.0.name"),
    ({"layers": [layer_doc(bytes=1.5)]}, "layers.0.bytes"),
    ({"layers": [layer_doc(fwd_ms=-1)]}, "layers.0.fwd_ms"),
    ({"layers": [layer_doc(bwd_ms="1")]}, "layers.0.bwd_ms"),
    ({"layers": [layer_doc(size=1)]}, "layers.0.size"),
    ({"layers": [layer_doc(index=i) for i in range(MAX_LAYERS + 1)]}, "layers"),
    ({"flows": None}, "flows"), ({"flows": 5}, "flows"),
    ({"flows": [flow_doc()] * (MAX_FLOWS + 1)}, "flows"),
    ({"flows": [flow_doc(layer=9)]}, "flows.0.layer"),
    ({"flows": [flow_doc(layer=None, layers=[0, 9])]}, "flows.0.layers"),
    ({"flows": [flow_doc(layers=[0])]}, "flows.0.layers"),
    ({"flows": [flow_doc(), flow_doc(src="10.0.0.2")]}, "flows.1.src"),
    ({"flows": [flow_doc(dst="10.0.0.300")]}, "flows.0.dst"),
    ({"flows": [flow_doc(proto="icmp")]}, "flows.0.proto"),
    ({"flows": [flow_doc(proto=None)]}, "flows.0.proto"),
    ({"flows": [flow_doc(sport=0)]}, "flows.0.sport"),
    ({"flows": [flow_doc(dport=70000)]}, "flows.0.dport"),
    ({"flows": [flow_doc(dport=1, dport_range=[1, 2])]}, "flows.0.dport_range"),
    ({"flows": [flow_doc(dport_range=[9, 2])]}, "flows.0.dport_range"),
    ({"flows": [flow_doc(dport_range=[1, 2, 3])]}, "flows.0.dport_range"),
    ({"flows": [flow_doc(dport_range=[0, 2])]}, "flows.0.dport_range.0"),
    ({"flows": [flow_doc(dscp=46)]}, "flows.0.dscp"),
])
def test_job_errors_name_the_field(changes, field):
    doc = job_doc(**changes)
    if "layers" in changes and changes["layers"] and isinstance(changes["layers"][0], dict):
        doc["flows"] = [flow_doc()]
    with pytest.raises(ValueError) as err:
        parse_job(doc)
    assert str(err.value).startswith(f"{field}: "), str(err.value)


@pytest.mark.parametrize("changes, error", [
    ({"polcy": "layer"}, "polcy: unknown field (did you mean policy?)"),
    ({"flows": [flow_doc(dprt=5001)]}, "flows.0.dprt: unknown field (did you mean dport?)"),
    ({"layers": [layer_doc(bytes="100")]}, "layers.0.bytes: '100' is not allowed (an integer 0..1099511627776)"),
    ({"hosts": [*HOSTS, "10.0.0.300"]},
     "hosts.2: '10.0.0.300' is not allowed (a non-empty list of IPv4 addresses such as \"10.0.0.1\")"),
    ({"policy": "lifo"}, "policy: 'lifo' is not allowed (one of fifo, layer, tictac, size)"),
])
def test_job_document_errors_come_from_the_schema_engine(changes, error):
    """The document is declared (JobDocument, Layer, FlowEntry) and built by common/schema.py,
    the engine of the specs and the host apps' command line: typos get the close name."""
    with pytest.raises(SchemaError) as err:
        parse_job(job_doc(**changes))
    assert str(err.value) == error


@given(st.lists(st.none() | st.tuples(st.integers(1, 65535), st.integers(1, 65535)), max_size=6))
def test_job_mark_count_is_the_number_of_rewrites(ranges):
    flows = [flow_doc() if r is None else flow_doc(dport_range=sorted(r)) for r in ranges]
    job = parse_job(job_doc(flows=flows))
    assert job_mark_count(job) == len(job_flow_classes(job))


def test_job_document_must_be_an_object():
    with pytest.raises(ValueError, match=r"^document: .* is not allowed \(a mapping with keys job, policy, "):
        parse_job([job_doc()])


# -- REST, on a real controller without switches, through the runner's client ------------------
@pytest.fixture(scope="module")
def controller_rest():
    rest_port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "controller", "--rest-port", str(rest_port),
                             "--ofp-port", str(free_port())], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    client = SimpleNamespace(rest_port=rest_port)  # what Fabric.rest uses of a Fabric

    def call(path: str, method: str = "GET", body=None, **headers):
        """A JSON document through the runner's client (Fabric.rest); bytes, or a request
        with more headers, sent as they are."""
        try:
            if not isinstance(body, bytes) and not headers:
                return 200, Fabric.rest(client, path, method, body)
            req = urllib.request.Request(f"http://127.0.0.1:{rest_port}{path}", data=body,
                                         method=method,
                                         headers={"Content-Type": "application/json", **headers})
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    deadline = time.monotonic() + 20
    while True:
        try:
            call("/jobs")
            break
        except urllib.error.URLError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)
    yield call
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert "Traceback" not in err, err


def test_rest_jobs(controller_rest):
    assert controller_rest("/jobs") == (200, [])
    status, job = controller_rest("/jobs", "POST", job_doc())
    assert status == 200
    assert [layer["dscp"] for layer in job["layers"]] == [CS6, CS5, CS4, CS3, CS2, CS2]
    assert job["classes"][0] == {"src": HOSTS[0], "dst": HOSTS[1], "dscp": CS6, "proto": "tcp",
                                 "dport": 5001}
    assert job["classes"][1]["dport_mask"] == 0xFFF8
    assert controller_rest("/jobs") == (200, [job])
    status, replaced = controller_rest("/jobs", "POST", job_doc(policy="fifo"))
    assert status == 200 and {layer["dscp"] for layer in replaced["layers"]} == {0}
    assert controller_rest("/jobs") == (200, [replaced])
    assert controller_rest("/jobs/j1", "DELETE") == (200, [])
    status, body = controller_rest("/jobs/j1", "DELETE")
    assert status == 404 and body["error"].startswith("job: ")


@pytest.mark.parametrize("body, field", [
    (b"{not json", "body: not JSON (Expecting property name"),
    (job_doc(policy="x"), "policy: "),
    (job_doc(flows=[flow_doc(dport_range=[2, 1])]), "flows.0.dport_range: "),
])
def test_rest_job_errors(controller_rest, body, field):
    status, answer = controller_rest("/jobs", "POST", body)
    assert status == 400 and answer["error"].startswith(field), answer
    assert controller_rest("/jobs") == (200, [])


def test_rest_refuses_a_foreign_host_over_the_wire(controller_rest):
    """The Host check compares with the address the server listens on (DNS rebinding)."""
    status, answer = controller_rest("/jobs", host="evil.example")
    assert status == 403 and answer["error"].startswith("Host: 'evil.example'"), answer
