"""The plan of each run, from the spec alone: what the runner will launch and register, and the dry run
that refuses, naming the field, what the host apps or the controller would refuse once a fabric is up."""
import dataclasses

import pytest

from experiments import runplan
from experiments.runplan import dry_run, plan_run
from experiments.spec import SpecError, load_spec, parse_spec
from hostapps.config import config_from_args, process_arguments
from helpers import FIXTURES, REPO

SHIPPED = sorted((REPO / "experiments").glob("*.yaml")) + sorted((FIXTURES / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_every_run_of_the_shipped_specs_plans(path):
    spec = load_spec(path)
    plans = dry_run(spec)
    assert [plan.run for plan in plans] == [job_run for run in spec.runs for job_run in run.job_runs]
    for plan in plans:
        config = plan.run.config
        assert [(p.role, p.host) for p in plan.processes] == \
            [("server", host) for host in config.server_hosts] + [("worker", host) for host in config.worker_hosts]
        assert plan.lower_bound_s > 0 and plan.bounds["link_bound_s"] > 0


def test_a_planned_process_reads_its_command_line_back_as_it_was_planned():
    plan = plan_run(load_spec(REPO / "experiments" / "smoke.yaml", ["job.mode=ps"]).runs[0])
    for process in plan.processes:
        launched = dataclasses.replace(process.config, out="/tmp/run", tag=7, layer_dscp={0: 10})
        assert config_from_args([process.role, *process_arguments(launched)]) == launched


def test_the_plan_addresses_hosts_as_the_fabric_layout_does():
    plan = plan_run(parse_spec({"controller": {"sched": "layer"}}).runs[0])
    assert plan.document["hosts"] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert plan.processes[0].config.workers[1] == ("10.0.0.2", runplan.WORKER_PORT)
    assert plan.job_id == "run0"


def test_a_fifo_job_is_registered_only_for_its_droppable_marks():
    assert plan_run(parse_spec({}).runs[0]).document is None
    marked = parse_spec({"job": {"transport": "mlt", "loss_bound": 0.1, "drop_marking": True}})
    assert plan_run(marked.runs[0]).document["policy"] == "fifo"


def test_the_layer_table_is_the_same_for_every_seed():
    """It is computed once per model and batch, not per run: the seed sets the weights' values only."""
    runs = parse_spec({"job": {"model": {"conv": 4}}, "repetitions": 3}).runs
    tables = [runplan.layer_table(run) for run in runs]
    assert tables[0] == tables[1] == tables[2]
    tables[0][0]["bytes"] = -1  # a caller's copy
    assert runplan.layer_table(runs[0])[0]["bytes"] > 0


REFUSED = [
    # an MLP of depth 1 has two tensors: a third shard would hold nothing
    ({"topology": {"leaves": 4}, "job": {"mode": "ps", "servers": 5, "model": {"depth": 1}, "batch": 3}},
     "job.servers: 5 shards but the model has only 2 tensors, so shard 2 would hold no data (the host apps would "
     "refuse --servers)"),
    ({"job": {"mode": "ps", "model": {"name": "vgg16", "scale": 0.1}, "ps_slice_bytes": 1024}},
     "job.ps_slice_bytes: 1024 bytes cut layer fc6 (41105816 bytes) into 40143 slices, more than the 32768 the "
     "message step field can number (the host apps would refuse --ps-slice-bytes)"),
    # 48 TCP processes: 2 x 48 x 47 connections' directions
    ({"topology": {"leaves": 8, "hosts_per_leaf": 6}, "controller": {"sched": "tictac"}, "job": {"batch": 48}},
     "job.workers: the controller refuses the job: flows: 4512 items is more than the 4096 allowed"),
    ({"live": 8080}, "live: 8080 is not allowed (a port 1024..65535 of 127.0.0.1 other than the controller's "
                     "OpenFlow 6653 and REST 8080)"),
    ({"live": 6653}, "live: 6653 is not allowed (a port 1024..65535 of 127.0.0.1 other than the controller's "
                     "OpenFlow 6653 and REST 8080)"),
]


@pytest.mark.parametrize("document,message", REFUSED, ids=[message.split(":")[0] for _, message in REFUSED])
def test_what_the_runner_would_fail_on_is_refused_naming_the_field(document, message):
    spec = parse_spec(document)  # the spec alone is fine
    with pytest.raises(SpecError) as error:
        dry_run(spec)
    assert str(error.value) == f"spec error: {message}"


def test_a_refusal_names_the_run_of_the_matrix():
    spec = parse_spec({"topology": {"leaves": 4}, "job": {"mode": "ps", "model": {"depth": 1}, "batch": 3,
                                                          "workers": 3},
                       "matrix": {"shards": {"field": "job.servers", "values": [2, 5]}}})
    with pytest.raises(SpecError, match=r"^spec error: job\.servers: 5 shards .* \(in run shards=5\)$"):
        dry_run(spec)


def test_a_job_that_needs_more_memory_than_the_machine_has_is_refused(monkeypatch):
    monkeypatch.setattr(runplan, "machine_memory_bytes", lambda: 100 * 2**20)
    assert dry_run(parse_spec({}))  # four MLP workers: 84 MiB and their models
    with pytest.raises(SpecError) as error:
        dry_run(parse_spec({"topology": {"leaves": 4}}))
    assert str(error.value).startswith("spec error: job.model: {conv: 0, depth: 2, name: mlp, scale: 0.01, width: 64} "
                                       "is not allowed (its 8 host-app processes need at least 0.2 GiB")
    assert str(error.value).endswith("more than this machine's 0.1 GiB)")


def test_the_memory_a_job_needs_counts_each_server_of_a_cluster_apart(monkeypatch):
    spec = parse_spec({"topology": {"leaves": 4}, "cluster": {"servers": ["localhost", "s2"]}})
    plan = plan_run(spec.runs[0])
    alone = plan_run(parse_spec({"topology": {"leaves": 4}}).runs[0])
    assert runplan.memory_needed_bytes(plan) == runplan.memory_needed_bytes(alone) // 2


def test_the_machine_memory_is_read():
    assert runplan.machine_memory_bytes() > 2**30


def test_data_flows_are_the_seeded_5_tuples_of_the_job_and_its_bulk_flows():
    runs = {run.run_id: run for run in load_spec(REPO / "experiments" / "headline.yaml").runs}
    tcp = runplan.data_flows(runs["scheme=baseline,mode=allreduce,rep=1"])
    plan = runplan.processes(runs["scheme=baseline,mode=allreduce,rep=1"])
    first = plan[0].config.source_port
    # worker0 dials its ring neighbours of higher rank, the j-th from its source port + j, both ways
    assert tcp[:2] == [runplan.DataFlow("worker0->worker1", "h1", "h2", "tcp", first, runplan.WORKER_PORT),
                       runplan.DataFlow("worker1->worker0", "h2", "h1", "tcp", runplan.WORKER_PORT, first)]
    ring = [flow for flow in tcp if flow.what.startswith("worker")]
    assert len(ring) == 2 * 5  # 5 ring links, both ways
    bulk = [flow for flow in tcp if flow.what.startswith("flow")]
    assert [(flow.src, flow.dst, flow.dport) for flow in bulk] == [("h4", "h7", runplan.IPERF_PORT),
                                                                    ("h7", "h4", runplan.IPERF_PORT + 10)]
    # the same seed, the same 5-tuples for every TCP scheme; mlt's are its own, one port a process
    assert runplan.data_flows(runs["scheme=control,mode=allreduce,rep=1"]) == tcp
    mlt = runplan.data_flows(runs["scheme=mlt,mode=allreduce,rep=1"])
    assert {flow.proto for flow in mlt if flow.what.startswith("worker")} == {"udp"}
    assert len({flow.sport for flow in mlt if flow.what.startswith("worker0")}) == 1
    # sprayed datagrams have no placement: only the bulk flows are left
    assert all(flow.what.startswith("flow") for flow in runplan.data_flows(runs["scheme=spray,mode=ps,rep=1"]))
    assert runplan.data_flows(runs["scheme=baseline,mode=allreduce,rep=2"]) != tcp  # another seed
