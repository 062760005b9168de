"""A spec with a model from a profiler trace (job.model.trace) and a fabric from a file (topology.file):
both modes validate and plan (host apps' configs, layer table, controller's job document, bounds), a
fabric file is a fabric like the built-in kinds to everything that reads one, and bad input is one
line naming the field."""
import json

import pandas as pd
import pytest

from experiments import metrics
from experiments.runplan import dry_run, fabric_params, plan_run
from experiments.spec import SpecError, load_spec, parse_spec
from experiments.spec.schema import Topology
from experiments.spec.topology import layout_of
from experiments.traffic import link_bound_s
from helpers import FIXTURES, REPO
from hostapps.config import config_from_args, process_arguments
from hostapps.profiles import PROFILES
from topologies.layout import leaf_spine

RESNET50 = "tests/fixtures/traces/resnet50_v100.json.gz"
CLOS = "experiments/topologies/clos3.yaml"


def spec(**sections) -> dict:
    base = {"topology": {"file": CLOS}, "job": {"model": {"trace": RESNET50}, "workers": 8, "servers": 2,
                                                "iterations": 5, "batch": 16}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


@pytest.mark.parametrize("mode", ["allreduce", "ps"])
def test_a_traced_model_on_a_fabric_file_plans_in_both_modes(mode):
    plan = plan_run(parse_spec(spec(job={"mode": mode}, controller={"sched": "tictac"})).runs[0])
    written = PROFILES["resnet50"]()
    assert [layer["name"] for layer in plan.layers][:2] == ["conv2d.0", "batch_norm.0"]
    assert [layer["bytes"] for layer in plan.layers] == [4 * max(1, round(layer.params * 0.01))
                                                         for layer in written.layers]
    assert plan.document["layers"] == plan.layers  # the controller took it (tictac times its classes by them)
    assert all(layer["fwd_ms"] > 0 and layer["bwd_ms"] > 0 for layer in plan.layers)
    workers = [process for process in plan.processes if process.role == "worker"]
    assert [process.host for process in workers] == [f"h{n}" for n in range(1, 9)]
    assert [process.host for process in plan.processes if process.role == "server"] == (
        ["h11", "h12"] if mode == "ps" else [])
    argv = process_arguments(workers[0].config)
    assert argv[argv.index("--model") + 1] == "trace" and argv[argv.index("--model-trace") + 1] == RESNET50
    assert config_from_args(["worker", *argv]).model == workers[0].config.model
    assert plan.lower_bound_s > 0 and plan.bounds["link_bound_s"] > 0


def test_the_shipped_example_validates_and_plans_both_modes():
    loaded = load_spec(REPO / "experiments" / "bring_your_own.yaml")
    plans = dry_run(loaded)
    assert [plan.run.job.mode for plan in plans] == ["allreduce", "ps"]
    assert fabric_params(plans[0].run.topology) == {"path": CLOS, "host_bw": 50.0, "fabric_bw": 50.0, "mtu": 9000,
                                                    "tcp_cc": "cubic"}
    assert all(sum(plan.layer_sizes) == 4 * sum(max(1, round(layer.params * 0.01))
                                                for layer in PROFILES["resnet50"]().layers) for plan in plans)


def test_a_fabric_file_is_a_fabric_to_names_links_faults_and_bounds():
    topology = parse_spec(spec()).runs[0].topology
    assert topology.kind == "file" and [node.name for node in layout_of(topology).hosts] == [
        f"h{n}" for n in range(1, 13)]
    faulted = parse_spec(spec() | {"faults": [{"kind": "link_down", "link": "core1-agg3", "at_s": 1,
                                                          "duration_s": 2}]})
    assert faulted.runs[0].config.faults[0].link == "core1-agg3"
    with pytest.raises(SpecError, match=r"faults\.0\.link: 'leaf1-spine1' is not allowed \(a link of the topology"):
        parse_spec(spec() | {"faults": [{"kind": "link_down", "link": "leaf1-spine1", "at_s": 1, "duration_s": 2}]})


def test_the_bound_counts_a_slower_link(tmp_path):
    """A ring of four over two leaves and one spine: two ring hops cross the spine, 3/2 of the model
    each way on a leaf's uplink as on a host's link; at a quarter of the rate, the uplinks bound it 4x."""
    bounds = []
    for speed in (1, 0.25):
        path = tmp_path / f"speed{speed}.yaml"
        path.write_text(f"switches: {{spine: 1, leaf: 2}}\nhosts: {{leaf1: 2, leaf2: 2}}\n"
                        f"links: [{{a: leaf1..leaf2, b: spine1, speed: {speed}}}]\n")
        run = parse_spec({"topology": {"file": str(path)}, "job": {"workers": 4}}).runs[0]
        bounds.append(link_bound_s(run, [4000] * 10))
    assert bounds[1] == pytest.approx(4 * bounds[0])


@pytest.mark.parametrize("overrides,message", [
    ({"job": {"model": {"trace": "no/such.json"}}},
     r"job\.model\.trace: 'no/such\.json' cannot be read \(No such file or directory\)$"),
    ({"job": {"model": {"trace": "tests/fixtures/traces/inference_no_backward.json.gz"}}},
     r"job\.model\.trace: '[^']+' has no backward pass \(no torch::autograd::AccumulateGrad op"),
    ({"job": {"model": {"name": "resnet50", "trace": RESNET50}}},
     r"job\.model\.trace: '[^']+' is not allowed \(none with model resnet50: a trace is the model"),
    ({"job": {"model": {"name": "trace"}}}, r"job\.model\.trace: missing \(model trace is the profile of a trace"),
    ({"topology": {"file": "nowhere.yaml"}}, r"topology\.file: 'nowhere\.yaml': cannot be read \(No such file"),
    ({"topology": {"file": CLOS, "spines": 4}},
     r"topology\.spines: 4 is not allowed \(left out with topology\.file: the file gives the fabric's shape\)"),
    ({"topology": {"file": CLOS, "kind": "fattree"}},
     r"topology\.kind: 'fattree' is not allowed \(file, or left out, with topology\.file\)"),
    ({"topology": {"kind": "file"}}, r"topology\.file: missing \(kind file: the fabric file's path\)"),
    ({"topology": {"file": "tests/fixtures/traces/synthetic_cpu.json"}},
     r"topology\.file: '[^']+': schemaVersion: unknown field \(allowed: description, switches, hosts, links\)"),
])
def test_bad_traces_and_fabric_files_are_one_line_naming_the_field(overrides, message):
    document = {"job": {"model": {"trace": RESNET50}, "iterations": 5}} | overrides
    with pytest.raises(SpecError, match=f"^spec error: {message}") as error:
        parse_spec(document)
    assert "\n" not in str(error.value)


def test_a_fabric_file_beyond_this_machine_is_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("switches: {spine: 2, leaf: 20}\nhosts: {" + ", ".join(f"leaf{n}: 7" for n in range(1, 21))
                   + "}\nlinks: [{a: leaf1..leaf20, b: spine1..spine2}]\n")
    with pytest.raises(SpecError, match=r"^spec error: topology\.file: .+ is not allowed \(one machine runs "
                                        r"at most 128 hosts and 64 switches; this makes 140 hosts and 22 switches\)"):
        parse_spec({"topology": {"file": str(big)}})
    wide = tmp_path / "wide.yaml"
    wide.write_text("switches: {spine: 1, leaf: 1}\nhosts: {leaf1: 1100}\nlinks: [{a: leaf1, b: spine1}]\n")
    with pytest.raises(SpecError, match=r"^spec error: topology\.file: .+ is not allowed \(at most 1024 ports per "
                                        r"switch, well inside OpenFlow's 0xff00; each leaf would have 1101"):
        parse_spec({"topology": {"file": str(wide)}})


def test_the_built_in_leaf_spine_as_a_file_is_the_same_fabric_to_the_spec():
    file = parse_spec({"topology": {"file": "tests/fixtures/topologies/leafspine_2x2x2.yaml"}}).runs[0]
    built = parse_spec({}).runs[0]
    assert layout_of(file.topology) == layout_of(built.topology) == leaf_spine(2, 2, 2)
    assert [process.host for process in plan_run(file).processes] == [
        process.host for process in plan_run(built).processes]
    assert Topology(file="x.yaml").kind == "file" and Topology().kind == "leafspine"


def test_uplink_imbalance_counts_the_edges_of_a_clos():
    """links.csv rows of a 3-tier Clos (role edge): edge1 sent 300 and 100 bytes up, edge3 200 and 200."""
    rows = [("edge1", 4, "fabric", 300, "edge"), ("edge1", 5, "fabric", 100, "edge"),
            ("edge3", 4, "fabric", 200, "edge"), ("edge3", 5, "fabric", 200, "edge"),
            ("agg1", 3, "fabric", 999, "agg"), ("edge1", 1, "host", 5000, "edge")]
    links = pd.DataFrame(rows, columns=["switch", "port", "tier", "tx_bytes", "role"])
    assert metrics.uplink_imbalance(links) == pytest.approx((1.5 * 400 + 1.0 * 400) / 800)


def test_the_trace_fixtures_readme_names_every_fixture():
    readme = (FIXTURES / "traces" / "README.md").read_text()
    for path in (FIXTURES / "traces").iterdir():
        if path.suffix in (".gz", ".json"):
            assert path.name in readme, path.name
    assert json.loads((FIXTURES / "traces" / "synthetic_cpu.json").read_text())["schemaVersion"] == 1
