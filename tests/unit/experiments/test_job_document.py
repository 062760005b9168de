"""The job document the runner registers with the controller: its layer table carries each
layer's forward and backward compute, so the controller's tictac policy is timed by the model."""
import pytest

from controller.scheduling import layer_dscps, parse_job
from experiments.runplan import SERVER_PORT, WORKER_PORT, job_document
from experiments.spec import parse_spec
from hostapps.profiles import PROFILES, ProfileModel


def spec_run(**job):
    spec = parse_spec({"topology": {"host_bw": 100}, "controller": {"sched": "tictac"}, "job": job})
    run = spec.runs[0]
    return run, {host: f"10.0.0.{i}" for i, host in enumerate(run.config.hosts, 1)}


def test_a_profile_job_sends_the_times_its_workers_emulate():
    run, ip = spec_run(mode="ps", model={"name": "resnet50", "scale": 0.01},
                       workers=["h1", "h2", "h3"], servers=["h4"])
    document = job_document(run, "run0", ip)
    model = ProfileModel(PROFILES["resnet50"](), 0.01, 100)
    layers = document["layers"]
    assert [layer["fwd_ms"] for layer in layers] == pytest.approx([s * 1000 for s in model.forward_s])
    assert [layer["bwd_ms"] for layer in layers] == pytest.approx([s * 1000 for s in model.backward_s])
    job = parse_job(document)  # the controller takes it as it is
    assert job.policy == "tictac" and len(job.layers) == len(model.layers)
    assert layer_dscps("tictac", job.layers) != layer_dscps("layer", job.layers)
    assert {(flow["proto"], flow.get("dport", flow.get("sport"))) for flow in document["flows"]} == \
        {("tcp", WORKER_PORT), ("tcp", SERVER_PORT)}


def test_the_numpy_network_sends_times_estimated_from_its_flops():
    run, ip = spec_run(model={"width": 64, "depth": 2, "conv": 4}, batch=48)  # 12 rows a worker
    layers = job_document(run, "run0", ip)["layers"]
    assert [layer["name"] for layer in layers] == ["conv", "fc1", "fc2", "out"]
    # 2 FLOPs per multiply-add: conv 9 x 4 channels x 64 pixels, then 256x64, 64x64, 64x10
    flops = [2 * 9 * 4 * 64 * 12, 2 * 256 * 64 * 12, 2 * 64 * 64 * 12, 2 * 64 * 10 * 12]
    fwd_ms = [layer["fwd_ms"] for layer in layers]
    assert [ms / fwd_ms[0] for ms in fwd_ms] == pytest.approx([f / flops[0] for f in flops])
    # backward: the weight gradient, and the input gradient but for the first layer
    assert [layer["bwd_ms"] for layer in layers] == pytest.approx([fwd_ms[0]] + [2 * ms for ms in fwd_ms[1:]])
