"""Where per-flow ECMP puts a run's flows, probed on a real fabric (emulation/placement.py)."""
from emulation import placement
from emulation.fabric import Fabric
from experiments.runplan import data_flows, fabric_params
from experiments.spec import load_spec
from helpers import REPO


def test_every_crossing_flow_is_placed_on_an_uplink_and_again_alike(tmp_path):
    run = load_spec(REPO / "experiments" / "headline.yaml").runs[0]  # TCP ring of 5 and two bulk flows
    flows = data_flows(run)
    with Fabric(run.topology.kind, fabric_params(run.topology), lb="ecmp", workdir=tmp_path) as fab:
        fab.wait_reachable()
        placed = placement.measure(fab, flows)
        assert placement.measure(fab, flows) == placed, "a 5-tuple takes one path"
    leaf = {f"h{i}": "leaf1" if i <= 4 else "leaf2" for i in range(1, 9)}
    for flow, where in zip(flows, placed):
        assert where.switch == leaf[flow.src]
        crossing = leaf[flow.src] != leaf[flow.dst]
        assert (where.uplink in ("spine1", "spine2")) == crossing, (flow, where)
    summary = placement.summary(placed)
    assert sum(len(whats) for by_uplink in summary["uplinks"].values() for whats in by_uplink.values()) == \
        sum(leaf[flow.src] != leaf[flow.dst] for flow in flows)
    assert summary["max_flows_per_uplink"] >= 2  # 4 crossing flows a leaf over 2 uplinks
