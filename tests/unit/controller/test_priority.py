"""FlowClass validation (REST input, a ClassEntry on the schema engine), class selectors, where
a flow is marked, match keys."""
import pytest
from hypothesis import given, strategies as st

from common.classes import class_selector
from controller.priority import MAX_FLOWS, ClassEntry, FlowClass, _is_dotted_ipv4, flow_classes, ingress_switch, is_ipv4
from helpers.fabric_views import LEAF, ip, leaf_spine
from common import schema

BASE = {"src": "10.0.0.1", "dst": "10.0.0.2", "dscp": 46}


def flow(**changes):
    return {**BASE, **changes}


def from_dict(data, at: str = "") -> FlowClass:
    """A FlowClass from a REST flow object at path `at`, as POST /fabric/classes reads one."""
    return schema.build(ClassEntry, data, at).flow_class(at)


@pytest.mark.parametrize("data, expected", [
    (BASE, FlowClass("10.0.0.1", "10.0.0.2", 46)),
    (flow(dscp=0, proto="udp"), FlowClass("10.0.0.1", "10.0.0.2", 0, "udp")),
    (flow(dscp=63, proto="tcp", sport=1, dport=65535),
     FlowClass("10.0.0.1", "10.0.0.2", 63, "tcp", 1, 65535)),
    (flow(proto="tcp", dport=5201), FlowClass("10.0.0.1", "10.0.0.2", 46, "tcp", None, 5201)),
    (flow(proto=None, sport=None), FlowClass("10.0.0.1", "10.0.0.2", 46)),
])
def test_from_dict_valid(data, expected):
    got = from_dict(data)
    assert got == expected
    assert from_dict(got.to_dict()) == got
    assert None not in got.to_dict().values()


@pytest.mark.parametrize("data, field", [
    ("10.0.0.1>10.0.0.2", "document"),
    ([BASE], "document"),
    (flow(prio=3), "prio"),
    (flow(queue=1, zzz=2), "queue"),
    ({"dst": "10.0.0.2", "dscp": 1}, "src"),
    (flow(src="10.0.0"), "src"),
    (flow(src="10.0.0.256"), "src"),
    (flow(src="::1"), "src"),
    (flow(src="h1"), "src"),
    (flow(src=None), "src"),
    (flow(dst=""), "dst"),
    (flow(dst=["10.0.0.2"]), "dst"),
    ({"src": "10.0.0.1", "dst": "10.0.0.2"}, "dscp"),
    (flow(dscp=-1), "dscp"),
    (flow(dscp=64), "dscp"),
    (flow(dscp=True), "dscp"),
    (flow(dscp=46.0), "dscp"),
    (flow(dscp="46"), "dscp"),
    (flow(proto="icmp"), "proto"),
    (flow(proto="TCP"), "proto"),
    (flow(proto=6), "proto"),
    (flow(sport=80), "sport"),
    (flow(dport=80), "dport"),
    (flow(proto="tcp", sport=0), "sport"),
    (flow(proto="tcp", sport=65536), "sport"),
    (flow(proto="udp", sport=True), "sport"),
    (flow(proto="udp", dport="80"), "dport"),
    (flow(proto="udp", dport=-5), "dport"),
    (flow(src=167772161), "src"),
    (flow(proto=["tcp"]), "proto"),
])
def test_from_dict_invalid_names_the_field(data, field):
    with pytest.raises(ValueError) as err:
        from_dict(data)
    assert str(err.value).startswith(f"{field}: "), str(err.value)


def test_from_dict_errors_name_the_path():
    with pytest.raises(ValueError, match=r"^flows\.3\.dscp: 99 is not allowed \(an integer 0\.\.63\)$"):
        from_dict(flow(dscp=99), "flows.3")
    with pytest.raises(ValueError, match=r"^flows\.3\.prio: unknown field"):
        from_dict(flow(prio=1), "flows.3")
    with pytest.raises(ValueError, match=r"^flows\.3: \[.* is not allowed \(a mapping with keys src, dst, "):
        from_dict([BASE], "flows.3")
    with pytest.raises(ValueError, match=r"^flows\.3\.dport: needs proto \(tcp or udp\)$"):
        from_dict(flow(dport=80), "flows.3")


def test_flow_classes_is_a_bounded_list():
    entry = schema.build(ClassEntry, BASE)
    assert flow_classes([]) == []
    assert len(flow_classes([entry] * MAX_FLOWS)) == MAX_FLOWS
    with pytest.raises(ValueError, match=rf"^flows: {MAX_FLOWS + 1} items is more than the "
                                         rf"{MAX_FLOWS} allowed$"):
        flow_classes([entry] * (MAX_FLOWS + 1))


@given(st.integers().filter(lambda d: not 0 <= d <= 63))
def test_any_dscp_out_of_range_is_refused(dscp):
    with pytest.raises(ValueError, match=r"^dscp: "):
        from_dict(flow(dscp=dscp))


@given(st.integers(0, 63), st.sampled_from([None, "tcp", "udp"]),
       st.none() | st.integers(1, 65535), st.none() | st.integers(1, 65535))
def test_any_valid_class_round_trips(dscp, proto, sport, dport):
    data = flow(dscp=dscp, proto=proto)
    if proto is not None:
        data.update(sport=sport, dport=dport)
    got = from_dict(data)
    assert (got.dscp, got.proto) == (dscp, proto)
    assert from_dict(got.to_dict()) == got


@pytest.mark.parametrize("dscp, cs", [(0, 0), (7, 0), (8, 1), (10, 1), (26, 3), (34, 4),
                                      (46, 5), (48, 6), (56, 7), (63, 7)])
def test_class_selector(dscp, cs):
    assert class_selector(dscp) == cs


@given(st.integers(0, 63))
def test_class_selector_is_the_top_three_tos_bits(dscp):
    tos = dscp << 2
    assert class_selector(dscp) == (tos & 0xE0) >> 5


def test_ingress_switch_is_where_the_source_host_attaches():
    view = leaf_spine(2, 2, 2)
    assert ingress_switch(view, FlowClass(ip(3), ip(1), 46)) == LEAF + 2
    assert ingress_switch(view, FlowClass(ip(1), ip(3), 46)) == LEAF + 1
    assert ingress_switch(view, FlowClass("10.9.9.9", ip(1), 46)) is None, "source not learnt"
    view.set_port(LEAF + 2, 1, "leaf2-eth1", False)
    assert ingress_switch(view, FlowClass(ip(3), ip(1), 46)) is None, "source's port went down"


def test_match_key_ignores_dscp_only():
    a = FlowClass("10.0.0.1", "10.0.0.2", 46, "udp", 1000, 2000)
    assert a.match_key() == FlowClass("10.0.0.1", "10.0.0.2", 0, "udp", 1000, 2000).match_key()
    others = [
        FlowClass("10.0.0.3", "10.0.0.2", 46, "udp", 1000, 2000),
        FlowClass("10.0.0.1", "10.0.0.3", 46, "udp", 1000, 2000),
        FlowClass("10.0.0.1", "10.0.0.2", 46, "tcp", 1000, 2000),
        FlowClass("10.0.0.1", "10.0.0.2", 46, "udp", None, 2000),
        FlowClass("10.0.0.1", "10.0.0.2", 46, "udp", 1000, None),
        FlowClass("10.0.0.1", "10.0.0.2", 46, "udp", 2000, 1000),
        FlowClass("10.0.0.1", "10.0.0.2", 46),
    ]
    keys = {f.match_key() for f in [a, *others]}
    assert len(keys) == 1 + len(others)
    # A later class for one key replaces the earlier one (how the app merges classes).
    merged = {f.match_key(): f for f in [a, FlowClass("10.0.0.1", "10.0.0.2", 8, "udp", 1000, 2000)]}
    assert list(merged.values()) == [FlowClass("10.0.0.1", "10.0.0.2", 8, "udp", 1000, 2000)]


def test_refused_addresses_are_not_kept():
    """A string too long to be an address is refused before the cache: ten 1 MB strings would
    otherwise stay held (4096 of them, 4 GiB)."""
    before = _is_dotted_ipv4.cache_info().currsize
    for i in range(10):
        assert not is_ipv4(str(i) * (1 << 20))
    assert _is_dotted_ipv4.cache_info().currsize == before
    assert is_ipv4("255.255.255.255") and not is_ipv4("255.255.255.256")
