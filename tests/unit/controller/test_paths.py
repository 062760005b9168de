"""Paths per job (controller/paths.py, sharing `intensity-paths`): which spine each job's traffic
gets in the intensity ranking, the pins the core sends to fake switches and where packets then go,
and what a job's departure or a dead link does to them."""
import pytest

from controller import paths, pipeline
from controller.core import ControllerCore
from controller.scheduling import Layer, RegisteredJob, parse_job
from controller.topology import Host
from helpers.fabric_views import LEAF, SPINE, fat_tree, ip, leaf_spine
from helpers.fakeswitch import CoreNetwork, host_mac, tcp_frame

H = {n: ip(n) for n in range(1, 17)}


def job(name: str, a: int, b: int, compute_ms: float, comm_ms: float, sent: int = 1_000_000,
        sharing: str = "intensity-paths") -> RegisteredJob:
    """A job on hosts a and b of intensity compute_ms / comm_ms; its iteration (modelled: forward,
    then backward and communication together) is compute_ms / 2 + max(compute_ms / 2, comm_ms)."""
    half = compute_ms / 2
    return RegisteredJob(name, "fifo", (H[a], H[b]), (Layer(0, "l0", sent, half, half),), (), sharing, comm_ms)


# On a 2x2x3 leaf-spine (h1-h3 on leaf1, h4-h6 on leaf2), as experiments/multijob.yaml places them:
# resnet intensity 4 (load 1 MB / 400 ms), bert 1 (1 MB / 150 ms), vgg 0.25 (1 MB / 225 ms).
RESNET, BERT, VGG = job("resnet", 2, 5, 400, 100), job("bert", 3, 6, 100, 100), job("vgg", 1, 4, 50, 200)


def spines_of(chosen: list[paths.PinnedPath]) -> dict[str, set[int]]:
    """Job -> the spines its pinned paths cross."""
    spines: dict[str, set[int]] = {}
    for path in chosen:
        spines.setdefault(path.job, set()).update(
            dpid - SPINE for dpid, _ in path.hops if dpid > SPINE and dpid < SPINE + 0x100)
    return spines


def test_the_most_intense_job_gets_the_least_loaded_spine_and_the_next_the_other():
    view = leaf_spine(2, 2, 3)
    assert spines_of(paths.choose_paths(view, [VGG, RESNET])) == {"resnet": {1}, "vgg": {2}}
    # vgg made the more intense: the ranking, not the order of registration, decides
    vgg = job("vgg", 1, 4, 1000, 100)
    assert spines_of(paths.choose_paths(view, [RESNET, vgg])) == {"vgg": {1}, "resnet": {2}}


def test_three_jobs_on_two_spines_the_third_joins_the_least_loaded():
    """resnet (the most intense) spine1, bert spine2; vgg then joins the lighter spine: resnet's
    2.5 kB/ms under bert's 6.7 kB/ms."""
    chosen = paths.choose_paths(leaf_spine(2, 2, 3), [VGG, BERT, RESNET])
    assert spines_of(chosen) == {"resnet": {1}, "bert": {2}, "vgg": {1}}
    assert [(p.job, p.src, p.dst) for p in chosen] == [
        ("resnet", H[2], H[5]), ("resnet", H[5], H[2]), ("bert", H[3], H[6]), ("bert", H[6], H[3]),
        ("vgg", H[1], H[4]), ("vgg", H[4], H[1])]
    assert spines_of(paths.choose_paths(leaf_spine(3, 2, 3), [VGG, BERT, RESNET])) == {
        "resnet": {1}, "bert": {2}, "vgg": {3}}, "a spine each where there are three"


def test_a_job_documents_traffic_is_what_loads_the_links():
    """vgg's document says it sends 10 MB an iteration h1 -> h4: it outweighs resnet's spine1 share,
    so bert's reverse pair h6 -> h3 shares spine2 with vgg no more than it must."""
    heavy = RegisteredJob("vgg", "fifo", (H[1], H[4]), VGG.layers, (), "intensity-paths", 200,
                          traffic=((H[1], H[4], 10_000_000),))
    chosen = paths.choose_paths(leaf_spine(2, 2, 3), [heavy, BERT, RESNET])
    assert [(p.job, p.src, p.dst) for p in chosen if p.job == "vgg"] == [("vgg", H[1], H[4])]
    assert spines_of(chosen)["vgg"] == {1}
    demand = next(d for d in paths.demands([heavy], {"vgg": 0.25}))
    assert demand.load == pytest.approx(10_000_000 / 225)


def test_no_paths_without_a_policy_that_chooses_them_nor_inside_a_leaf():
    view = leaf_spine(2, 2, 3)
    assert paths.choose_paths(view, [job("a", 2, 5, 400, 100, sharing="intensity")]) == []
    assert paths.choose_paths(view, []) == []
    assert paths.choose_paths(view, [job("a", 1, 2, 400, 100)]) == [], "h1 and h2 share leaf1"


def test_on_a_fat_tree_two_jobs_across_pods_share_no_link_and_pins_sit_where_there_is_a_choice():
    view = fat_tree(4)  # h1-h4 in pod 0, h13-h16 in pod 3
    chosen = paths.choose_paths(view, [job("a", 1, 13, 400, 100), job("b", 2, 14, 100, 100)])
    hops = {p.job: set(p.hops) for p in chosen}
    assert len(chosen) == 4 and all(len(p.hops) == 4 for p in chosen)
    assert not hops["a"] & hops["b"]
    pins = paths.pins_by_switch(view, chosen)
    # edge -> agg and agg -> core have two ways each; core -> agg and agg -> edge one
    assert {dpid for dpid, pinned in pins.items() if (H[1], H[13]) in pinned} == {
        p.hops[i][0] for p in chosen if (p.src, p.dst) == (H[1], H[13]) for i in (0, 1)}


# -- the core on fake switches ----------------------------------------------------------------------
def network(spines: int = 2) -> CoreNetwork:
    wiring = leaf_spine(spines, 2, 3)
    hosts = [Host(h.ip, host_mac(h.ip), h.dpid, h.port) for h in wiring.hosts.values()]
    net = CoreNetwork(ControllerCore("ecmp", hosts), wiring)
    for dpid in sorted(wiring.switches):
        net.connect(dpid)
    return net


def ways(net: CoreNetwork, a: int, b: int) -> set[tuple[int, ...]]:
    """The switch paths a packet from host a to host b may take (every bucket a group may pick)."""
    ends = net.send(H[a], tcp_frame(H[a], H[b]))
    assert {e.end for e in ends} == {H[b]}
    return {e.path for e in ends}


def pins_held(net: CoreNetwork, dpid: int) -> dict[tuple[str, str], int]:
    """Switch dpid's pins: (src, dst) -> output port."""
    return {(e.match["ipv4_src"], e.match["ipv4_dst"]): e.instructions[0].actions[0].port
            for e in net.fabric.switches[dpid].flows(pipeline.FORWARD_TABLE) if e.priority == pipeline.PRIO_PIN}


def register(net: CoreNetwork, registered: RegisteredJob) -> None:
    net.deliver(net.core.register_job(registered))
    net.run()


def test_pins_take_each_jobs_packets_over_its_spine_and_leave_with_the_job():
    net = network()
    leaf1, leaf2, spine1, spine2 = LEAF + 1, LEAF + 2, SPINE + 1, SPINE + 2
    assert ways(net, 2, 5) == {(leaf1, spine1, leaf2), (leaf1, spine2, leaf2)}, "ECMP before"
    for registered in (VGG, RESNET, BERT):
        register(net, registered)
    # leaf1's ports 4 and 5 face spine1 and spine2; only the leaves have a choice to pin
    assert pins_held(net, leaf1) == {(H[2], H[5]): 4, (H[3], H[6]): 5, (H[1], H[4]): 4}
    assert pins_held(net, leaf2) == {(H[5], H[2]): 4, (H[6], H[3]): 5, (H[4], H[1]): 4}
    assert not pins_held(net, spine1) and not pins_held(net, spine2)
    assert ways(net, 2, 5) == {(leaf1, spine1, leaf2)} and ways(net, 5, 2) == {(leaf2, spine1, leaf1)}
    assert ways(net, 3, 6) == {(leaf1, spine2, leaf2)} and ways(net, 1, 4) == {(leaf1, spine1, leaf2)}
    assert ways(net, 2, 6) == {(leaf1, spine1, leaf2), (leaf1, spine2, leaf2)}, "across jobs: ECMP"
    described = {d["job"]: d["paths"] for d in net.core.describe_jobs()}
    assert described["bert"] == [{"src": H[3], "dst": H[6], "via": ["leaf1", "spine2", "leaf2"]},
                                 {"src": H[6], "dst": H[3], "via": ["leaf2", "spine2", "leaf1"]}]
    # resnet leaves: its pins go, and bert, the most intense left, takes the least loaded spine1
    net.deliver(net.core.remove_job("resnet"))
    net.run()
    assert pins_held(net, leaf1) == {(H[3], H[6]): 4, (H[1], H[4]): 5}
    assert ways(net, 2, 5) == {(leaf1, spine1, leaf2), (leaf1, spine2, leaf2)}
    for name in ("vgg", "bert"):
        net.deliver(net.core.remove_job(name))
    net.run()
    assert not any(pins_held(net, dpid) for dpid in net.fabric.switches)
    assert net.core.remove_job("bert") is None
    assert net.core.errors.count == 0


def test_a_reconnected_leaf_gets_its_pins_again_and_a_dead_uplink_moves_them_off_it():
    net = network()
    leaf1, leaf2, spine1, spine2 = LEAF + 1, LEAF + 2, SPINE + 1, SPINE + 2
    for registered in (RESNET, BERT):
        register(net, registered)
    net.disconnect(leaf2)
    net.connect(leaf2)
    assert pins_held(net, leaf2) == {(H[5], H[2]): 4, (H[6], H[3]): 5}
    assert ways(net, 5, 2) == {(leaf2, spine1, leaf1)}
    net.cut((leaf1, 4))  # leaf1 - spine1: one shortest way left between the leaves, the routes' own
    assert not any(pins_held(net, dpid) for dpid in net.fabric.switches)
    assert ways(net, 2, 5) == {(leaf1, spine2, leaf2)} and ways(net, 5, 2) == {(leaf2, spine2, leaf1)}
    assert ways(net, 6, 3) == {(leaf2, spine2, leaf1)}


def test_with_three_spines_a_dead_uplink_moves_the_jobs_to_the_two_left():
    net = network(spines=3)
    leaf1, leaf2 = LEAF + 1, LEAF + 2
    for registered in (VGG, RESNET, BERT):
        register(net, registered)
    assert pins_held(net, leaf1) == {(H[2], H[5]): 4, (H[3], H[6]): 5, (H[1], H[4]): 6}
    net.cut((leaf1, 4))  # leaf1 - spine1: resnet first on spine2, bert spine3, vgg with resnet (lighter)
    assert pins_held(net, leaf1) == {(H[2], H[5]): 5, (H[3], H[6]): 6, (H[1], H[4]): 5}
    assert pins_held(net, leaf2) == {(H[5], H[2]): 5, (H[6], H[3]): 6, (H[4], H[1]): 5}
    assert ways(net, 4, 1) == {(leaf2, SPINE + 2, leaf1)}


def test_under_intensity_alone_nothing_is_pinned():
    net = network()
    answer = net.core.register_job(job("a", 2, 5, 400, 100, sharing="intensity"))
    assert answer.messages == []
    net.deliver(answer)
    net.run()
    assert not any(pins_held(net, dpid) for dpid in net.fabric.switches)


# -- the job document's traffic -----------------------------------------------------------------------
def job_doc(**changes) -> dict:
    return {"job": "j1", "policy": "fifo", "hosts": [H[1], H[4]], "sharing": "intensity-paths",
            "layers": [{"index": 0, "name": "l0", "bytes": 100}], **changes}


def test_the_documents_traffic_becomes_the_jobs():
    traffic = [{"src": H[1], "dst": H[4], "bytes": 300}, {"src": H[4], "dst": H[1], "bytes": 0}]
    assert parse_job(job_doc(traffic=traffic)).traffic == ((H[1], H[4], 300), (H[4], H[1], 0))
    assert paths.host_pairs_traffic(parse_job(job_doc())) == ((H[1], H[4], 100.0), (H[4], H[1], 100.0))


@pytest.mark.parametrize("traffic, error", [
    ([{"src": H[1], "dst": H[9], "bytes": 1}], f"traffic.0.dst: {H[9]} is not one of the job's hosts"),
    ([{"src": H[1], "dst": H[1], "bytes": 1}],
     f"traffic.0.dst: {H[1]} is the src too (traffic goes between two hosts)"),
    ([{"src": H[1], "dst": H[4], "bytes": 1}] * 2, f"traffic.1: {H[1]} -> {H[4]} is given twice"),
    ([{"src": H[1], "dst": H[4], "bytes": -1}], "traffic.0.bytes: -1 is not allowed (an integer 0..1099511627776)"),
    ([{"src": H[1], "dst": H[4]}], "traffic.0.bytes: missing"),
])
def test_bad_traffic_is_one_line_naming_the_field(traffic, error):
    with pytest.raises(ValueError) as err:
        parse_job(job_doc(traffic=traffic))
    assert str(err.value).startswith(error), str(err.value)


def test_a_misspelt_sharing_policy_is_one_line():
    with pytest.raises(ValueError) as err:
        parse_job(job_doc(sharing="intensity-path"))
    assert str(err.value) == ("sharing: 'intensity-path' is not allowed "
                              "(one of fair, intensity, intensity-paths, timeshift)")


def test_pairs_past_the_most_pinned_keep_to_the_routes(monkeypatch):
    monkeypatch.setattr(paths, "MAX_PINNED_PAIRS", 3)
    chosen = paths.choose_paths(leaf_spine(2, 2, 3), [VGG, BERT, RESNET])
    assert [(p.job, p.src, p.dst) for p in chosen] == [
        ("resnet", H[2], H[5]), ("resnet", H[5], H[2]), ("bert", H[3], H[6])]
