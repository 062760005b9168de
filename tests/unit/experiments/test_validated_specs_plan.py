"""Whatever validates, runs: a generated spec (every section, matrix axes, knobs in and out of range,
odd YAML scalars) is either refused with one line naming the field, or the dry run plans every run
of it (what the runner computes before and for each run) without an exception.

SPEC_EXAMPLES sets how many specs one test run generates (default 60, a few seconds)."""
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, event, given, settings, strategies as st

from experiments.__main__ import run_list
from experiments.plan import plan_text
from experiments.runplan import dry_run
from experiments.spec import SpecError, load_spec

EXAMPLES = int(os.environ.get("SPEC_EXAMPLES", "60"))


class Raw(str):
    """A scalar written into the YAML text as it is."""


def emit(value) -> str:
    """Flow-style YAML of nested dicts and lists, Raw scalars as written, others as YAML dumps them."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {emit(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(emit(item) for item in value) + "]"
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n").removesuffix("\n...")


ODD = st.sampled_from([Raw(text) for text in (
    "~", "null", "'null'", "yes", "on", "off", "'true'", "1_000", "0x10", "0o7", "1e3", ".inf", "-.inf", ".nan",
    "2020-01-01", "'1'", "1.0", "-0", "''", "!!str 5", "!!float 4", "12:30", "0.0", "-1", "4294967296")])


def around(*values):
    """Mostly the values given (inside a range, at its edges, past them), sometimes any other."""
    given_ones = st.sampled_from(values)
    return st.one_of(given_ones, given_ones, given_ones, given_ones, given_ones, given_ones,
                     ODD, st.integers(-3, 70), st.floats(allow_nan=False, width=32))


HOSTS = st.sampled_from(["h1", "h2", "h3", "h4", "h5", "h8", "h9", "leaf1"])
LINKS = st.sampled_from(["h1-leaf1", "leaf1-h1", "h2-leaf1", "leaf1-spine1", "spine2-leaf2", "h1-h2", "edge1-agg1"])
MODEL = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["mlp", "resnet50", "vgg16", "bert", "gpt"]) | ODD,
    "width": around(1, 64, 1024, 1025), "depth": around(1, 2, 8, 9), "conv": around(0, 4, 64, 65),
    "scale": around(0.001, 0.01, 0.1, 1, 0, 2)})
JOB = st.fixed_dictionaries({}, optional={
    "mode": st.sampled_from(["allreduce", "ps", "ring"]), "task": st.sampled_from(["train", "inference"]),
    "model": MODEL, "iterations": around(3, 5, 2), "batch": around(1, 12, 48, 4096, 0),
    "seed": around(0, 7, 4294967295), "transport": st.sampled_from(["tcp", "mlt"]),
    "loss_bound": around(0, 0.05, 0.99, 1), "drop_marking": st.booleans() | ODD,
    "spray": st.sampled_from(["adaptive", "blind"]),
    "send_order": st.sampled_from(["ready", "best", "tictac", "caramel", "bytescheduler", "p3"]),
    "fusion": st.sampled_from(["none", "horovod", "ddp", "1024", "512", "65536"]) | ODD,
    "partition_bytes": around(1024, 65536, 1023), "credit_bytes": around(0, 262144),
    "ps_slice_bytes": around(0, 1024, 1026, 65536), "ps_update": st.sampled_from(["tensor", "iteration"]),
    "backward": st.sampled_from(["reverse", "caramel"]), "eval_every": around(0, 10),
    "workers": st.sampled_from(["all", 1, 2, 3, 5, 0]) | st.lists(HOSTS, max_size=4),
    "servers": st.sampled_from([1, 2, 3, 5, 9, 0]) | st.lists(HOSTS, max_size=3),
    "target_accuracy": around(0.5, 1, 0)})
TOPOLOGY = st.fixed_dictionaries({}, optional={
    "kind": st.sampled_from(["leafspine", "fattree", "torus"]), "spines": around(1, 2, 4),
    "leaves": around(1, 2, 4, 8), "hosts_per_leaf": around(1, 2, 3, 6), "k": around(2, 4, 6, 3),
    "host_bw": around(0.8, 10, 100, 100000, 0.5), "fabric_bw": around(0.8, 100, 200),
    "mtu": around(576, 1500, 9000, 575, 65536), "tcp_cc": st.sampled_from(["cubic", "reno", "bbr", "vegas"])})
CONTROLLER = st.fixed_dictionaries({}, optional={
    "lb": st.sampled_from(["ecmp", "spray", "single", "random"]),
    "sched": st.sampled_from(["fifo", "layer", "tictac", "best"]), "stats_interval_s": around(0.1, 1, 60, 0),
    "sharing": st.sampled_from(["fair", "intensity", "timeshift", "crux"])})
# a job of several: the job's fields, a name and a start
JOB_ENTRY = st.builds(lambda job, extra: {**job, **extra}, JOB, st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["a", "b", "a-1", "_x"]) | ODD, "start_s": around(0, 1.5, 20, 21)}))
CLUSTER = st.fixed_dictionaries({}, optional={
    "servers": st.sampled_from([[], ["localhost"], ["localhost", "s2"], ["s2"], ["localhost", "localhost"]]),
    "placement": st.sampled_from(["switchbin", "roundrobin", "random"])})
FLOW = st.fixed_dictionaries({"src": HOSTS | st.lists(HOSTS, max_size=3), "dst": HOSTS}, optional={
    "proto": st.sampled_from(["tcp", "udp"]), "rate_mbps": around(0, 0.001, 10),
    "start_s": around(0, 5, 86400), "duration_s": around(0.1, 10, 86401)})
FAULT = st.fixed_dictionaries({"kind": st.sampled_from(["link_down", "loss", "rate"]), "link": LINKS,
                               "at_s": around(0, 2, 5), "duration_s": around(1, 5, 10)}, optional={
    "loss_percent": around(0.01, 1, 100, 0.001), "rate_mbps": around(0.8, 10, 0.1)})
SECTIONS = {"topology": TOPOLOGY, "controller": CONTROLLER, "cluster": CLUSTER, "job": JOB,
            "jobs": st.lists(JOB_ENTRY, max_size=3),
            "background": st.lists(FLOW, max_size=3), "faults": st.lists(FAULT, max_size=3)}
FIELDS = st.sampled_from(["job.mode", "job.transport", "controller.lb", "controller.sched", "job.seed",
                          "job.loss_bound", "job.servers", "topology.spines", "job.model.depth", "job.fusion"])
SCALARS = st.sampled_from(["ps", "allreduce", "mlt", "tcp", "spray", "ecmp", "layer", 1, 2, 0.05, 5]) | ODD
LABELS = st.sampled_from(["a", "b", "base", "1", "null", "true"]) | ODD
SCALAR_AXIS = st.fixed_dictionaries({"field": FIELDS, "values": st.lists(SCALARS, min_size=1, max_size=3)},
                                    optional={"baseline": SCALARS})
MAPPING_AXIS = st.fixed_dictionaries(
    {"values": st.dictionaries(LABELS, st.dictionaries(FIELDS, SCALARS, max_size=2), min_size=1, max_size=3)},
    optional={"baseline": LABELS})
SPEC = st.fixed_dictionaries({}, optional={
    **SECTIONS, "name": st.sampled_from(["t"] * 9 + ["a b"]), "repetitions": st.sampled_from([1] * 6 + [2] * 3 + [101]),
    "live": st.sampled_from([8765] * 7 + [6653, 8080, 1023]), "matrix": st.dictionaries(
        st.sampled_from(["scheme", "mode", "lb", "seed", "run_id", "x"]), SCALAR_AXIS | MAPPING_AXIS, max_size=2)})


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPEC)
def test_a_generated_spec_is_refused_in_one_line_or_plans_every_run(document):
    text = emit(document)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "spec.yaml"
        path.write_text(text)
        try:
            spec = load_spec(path)
            plans = dry_run(spec)
        except SpecError as error:
            assert "\n" not in str(error), text
            event(f"refused: {error.path.split('.')[0] if '/' not in error.path else 'the file'}")
            return
    event("validated and planned")
    assert len(plans) == sum(len(run.job_runs) for run in spec.runs)
    assert run_list(spec) and plan_text(spec.name, plans)
