"""Fabrics described by a file (topologies/files.py): the built-in kinds written as files give their own
layouts (nodes, links, speeds, DPIDs, port numbers), the shipped examples are what their comments say,
the placement and the live view's rows work on them, and a bad file is refused with one line naming
the field. No network: Topos are built as graphs."""
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from experiments.live import drawing
from helpers import FIXTURES, REPO
from topologies.cluster import placement
from topologies.files import FabricFileError, fabric_layout, fabric_path, read_fabric
from topologies.layout import LEAF_ROLES, Layout, fat_tree, leaf_spine
from topologies.leafspine import FileTopo, LeafSpineTopo, TopologyError

EXAMPLES = REPO / "experiments" / "topologies"


def document_of(layout: Layout) -> dict:
    """A fabric file's document for a layout whose hosts are numbered switch by switch and whose
    switches' ports face their hosts first, then their switch links in the layout's order."""
    roles: dict[str, int] = {}
    for node in layout.switches:
        roles[node.role] = roles.get(node.role, 0) + 1
    hosts: dict[str, int] = {}
    links = []
    for link in layout.links:
        if link.tier == "host":
            hosts[link.a.name] = hosts.get(link.a.name, 0) + 1
        else:
            links.append({"a": link.a.name, "b": link.b.name, **({"speed": link.speed} if link.speed != 1 else {})})
    return {"switches": roles, "hosts": hosts, "links": links}


def test_the_built_in_leaf_spine_written_as_a_file_gives_its_layout():
    layout = read_fabric(str(FIXTURES / "topologies" / "leafspine_2x2x2.yaml"))
    assert layout == leaf_spine(2, 2, 2)  # the same nodes, links, speeds, port numbers, in the same order
    assert [node.dpid for node in layout.switches] == [0x2001, 0x2002, 0x1001, 0x1002]
    assert [node.ip for node in layout.hosts] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    topo = FileTopo(path="tests/fixtures/topologies/leafspine_2x2x2.yaml", host_bw=50, fabric_bw=200)
    built = LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2, host_bw=50, fabric_bw=200)
    assert topo.layout == built.layout
    assert sorted(topo.links(withInfo=True)) == sorted(built.links(withInfo=True))
    assert [topo.nodeInfo(name) for name in topo.nodes()] == [built.nodeInfo(name) for name in built.nodes()]


@settings(max_examples=30, deadline=None)
@given(spines=st.integers(1, 5), leaves=st.integers(1, 6), hosts=st.integers(1, 4))
def test_any_leaf_spine_round_trips_through_a_file(spines, leaves, hosts):
    built = leaf_spine(spines, leaves, hosts)
    assert fabric_layout(document_of(built)) == built


@pytest.mark.parametrize("k", [2, 4, 6])
def test_a_fat_tree_round_trips_through_a_file_but_for_the_order_of_its_lists(k):
    """A fat-tree lists its nodes pod by pod; a file tier by tier: the same nodes and links."""
    built = fat_tree(k)
    layout = fabric_layout(document_of(built))
    assert set(layout.nodes) == set(built.nodes) and set(layout.links) == set(built.links)
    assert len(layout.links) == len(built.links)


def test_the_three_tier_clos_example():
    layout = read_fabric("experiments/topologies/clos3.yaml")
    roles = [node.role for node in layout.switches]
    assert roles == ["core"] * 2 + ["agg"] * 4 + ["edge"] * 4 and len(layout.hosts) == 12
    assert layout.ports("edge1") == {1: layout.node("h1"), 2: layout.node("h2"), 3: layout.node("h3"),
                                     4: layout.node("agg1"), 5: layout.node("agg2")}
    assert layout.ports("agg3") == {1: layout.node("edge3"), 2: layout.node("edge4"), 3: layout.node("core1"),
                                    4: layout.node("core2")}
    assert layout.ports("core2") == {n: layout.node(f"agg{n}") for n in range(1, 5)}
    speeds = {link.names: link.speed for link in layout.links}
    assert all(speed == 0.5 for names, speed in speeds.items() if any(n.startswith("core") for n in names))
    assert sum(speed == 1 for speed in speeds.values()) == 12 + 8
    # A pod: six hosts, four links to the cores at half rate: 3:1 at equal host and fabric rates.
    pod_hosts = sum(1 for node in layout.hosts if node.number <= 6)
    pod_uplinks = sum(speed for names, speed in speeds.items() if names & {"agg1", "agg2"} and
                      any(n.startswith("core") for n in names))
    assert pod_hosts / pod_uplinks == 3
    topo = FileTopo(path="experiments/topologies/clos3.yaml", host_bw=40, fabric_bw=100)
    rates = {frozenset((a, b)): info["bw"] for a, b, info in topo.links(withInfo=True)}
    assert rates[frozenset(("agg1", "core2"))] == 50 and rates[frozenset(("edge1", "agg2"))] == 100
    assert rates[frozenset(("h1", "edge1"))] == 40


def test_the_slow_spine_example():
    layout = read_fabric("experiments/topologies/slow_spine.yaml")
    assert [node.name for node in layout.switches] == ["spine1", "spine2", "leaf1", "leaf2", "leaf3"]
    assert {link.names: link.speed for link in layout.links if link.tier == "fabric"} == {
        **{frozenset((f"leaf{n}", "spine1")): 1.0 for n in (1, 2, 3)},
        **{frozenset((f"leaf{n}", "spine2")): 0.5 for n in (1, 2, 3)}}
    assert layout.ports("leaf2") == {1: layout.node("h3"), 2: layout.node("h4"), 3: layout.node("spine1"),
                                     4: layout.node("spine2")}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda path: path.stem)
def test_placement_and_the_live_view_work_on_every_example(path):
    layout = read_fabric(str(path))
    where = placement(layout, ["localhost", "s2"], "switchbin")
    for link in layout.links:
        if link.tier == "host":
            assert where[link.a.name] == where[link.b.name], "a host stays with its leaf"
    for server in ("localhost", "s2"):
        assert {layout.node(name).role for name in where if where[name] == server} >= {"host", *(
            {node.role for node in layout.switches} - {"core", "spine"})}
    rows = {}
    for node in drawing(layout)["nodes"]:
        rows.setdefault(node["y"], set()).add(node["role"])
    assert [rows[y] for y in sorted(rows)][-2:] == [{node.role for node in layout.switches} & set(LEAF_ROLES),
                                                    {"host"}]


def _refusal(tmp_path, text: str) -> str:
    path = tmp_path / "fabric.yaml"
    path.write_text(text)
    with pytest.raises(FabricFileError) as error:
        read_fabric(str(path))
    assert "\n" not in str(error.value)
    return str(error.value)


GOOD = "switches: {spine: 2, leaf: 2}\nhosts: {leaf1: 2, leaf2: 2}\n"


@pytest.mark.parametrize("text,message", [
    ("switches: {spine: 2, leaf: 2}\n", "hosts: missing (a mapping of leaf (or edge) switches to their host counts"),
    ("switches: {spine: 2, leaves: 2}\nhosts: {}\n", "switches.leaves: unknown field (did you mean leaf?)"),
    ("switches: {spine: 2, leaf: 5000}\nhosts: {}\n", "switches.leaf: 5000 is not allowed (a count 0..4095"),
    ("switches: {spine: 2, leaf: 2, edge: 1}\nhosts: {}\n",
     "switches.edge: 1 is not allowed (0 with leaf switches: they share DPIDs, a file has one of leaf and edge)"),
    ("switches: {spine: 2}\nhosts: {}\n", "switches: {spine: 2} is not allowed (at least one leaf or edge switch"),
    ("switches: {spine: 2, leaf: 2}\nhosts: {leaf3: 1}\n",
     "hosts.leaf3: unknown switch (hosts hang off a leaf or edge switch of the file (leaf1..leaf2))"),
    ("switches: {spine: 2, leaf: 2}\nhosts: {spine1: 1}\n", "hosts.spine1: unknown switch"),
    ("switches: {spine: 2, leaf: 2}\nhosts: {leaf1: 0}\n", "hosts.leaf1: 0 is not allowed (a count of hosts >= 1)"),
    ("switches: {spine: 2, leaf: 2}\nhosts: {}\n",
     "hosts: {} is not allowed (at least one host, on a leaf or edge switch of the file (leaf1..leaf2))"),
    (GOOD + "links: [{a: leaf1, b: spine3}]", "links.0.b: 'spine3' is not allowed (a switch of the file or a list"),
    (GOOD + "links: [{a: leaf1..leaf3, b: spine1}]", "links.0.a: 'leaf1..leaf3' is not allowed"),
    (GOOD + "links: [{a: leaf2..leaf1, b: spine1}]", "links.0.a: 'leaf2..leaf1' is not allowed"),
    (GOOD + "links: [{a: [leaf1, leaf1], b: spine1}]", "links.0.a: [leaf1, leaf1] is not allowed"),
    (GOOD + "links: [{a: h1, b: spine1}]", "links.0.a: 'h1' is not allowed"),
    (GOOD + "links: [{a: leaf1, b: leaf1}]", "links.0: links leaf1 to itself"),
    (GOOD + "links: [{a: leaf1..leaf2, b: spine1}, {a: spine1, b: leaf2}]",
     "links.1: links spine1 and leaf2 twice (links.0 too): a fabric file has one link between two switches"),
    (GOOD + "links: [{a: leaf1, b: spine1, speed: 0}]", "links.0.speed: 0 is not allowed (a multiple of the "
                                                        "fabric's rate, > 0 and at most 100)"),
    (GOOD + "links: [{a: leaf1, b: spine1, rate: 2}]", "links.0.rate: unknown field"),
    (GOOD + "links: [{a: leaf1..leaf2, b: spine1}]", "links: spine2 cannot reach h1: every switch and host must"),
    (GOOD + "links: [{a: leaf1, b: spine1..spine2}]", "links: leaf2, h3, h4 cannot reach h1"),
    ("switches: {spine: 2, leaf: 2}\nswitches: {leaf: 1}\nhosts: {}\n", "is not YAML (found the key 'switches' twice"),
    ("switches: [", "is not YAML (while parsing a flow node expected the node content"),
    ("- 1\n", "document: [1] is not allowed (a mapping with keys description, switches, hosts, links)"),
])
def test_a_bad_fabric_file_is_refused_with_one_line_naming_the_field(tmp_path, text, message):
    assert _refusal(tmp_path, text).startswith(message)


def test_unreadable_and_too_large_files(tmp_path):
    with pytest.raises(FabricFileError, match=r"^cannot be read \(No such file or directory\)$"):
        read_fabric(str(tmp_path / "missing.yaml"))
    (tmp_path / "big.yaml").write_text("#" * (1 << 20) + "\n")
    with pytest.raises(FabricFileError, match=r"^is more than 1 MiB, too large for a fabric file$"):
        read_fabric(str(tmp_path / "big.yaml"))


def test_a_json_file_is_read_too_and_a_lone_leaf_needs_no_links(tmp_path):
    path = tmp_path / "one.json"
    path.write_text('{"switches": {"leaf": 1}, "hosts": {"leaf1": 3}}')
    layout = read_fabric(str(path))
    assert [node.name for node in layout.nodes] == ["leaf1", "h1", "h2", "h3"] and len(layout.links) == 3


def test_mn_names_the_path_of_a_bad_file():
    with pytest.raises(TopologyError, match=r"^path: nowhere.yaml: cannot be read \(No such file"):
        FileTopo(path="nowhere.yaml")
    with pytest.raises(TopologyError, match=r"^path: '' is not allowed \(a fabric file"):
        FileTopo()
    assert fabric_path("experiments/topologies/clos3.yaml") == EXAMPLES / "clos3.yaml"


def test_the_examples_parse_as_plain_yaml_with_their_comments():
    for path in EXAMPLES.glob("*.yaml"):
        assert yaml.safe_load(path.read_text())["description"]
