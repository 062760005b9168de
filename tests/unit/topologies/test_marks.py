"""Ownership marks (topologies/marks.py) and how a Topo carries them: a fabric's id when a fabric
claims it, hand-run when `mn` builds it as it is."""
import inspect

import pytest

from common.owner import OWNER_KEY
from topologies import marks
from topologies.leafspine import FatTreeTopo, LeafSpineTopo
from topologies.nodes import OVSUserSwitch, ShapedIntf


def test_a_fabrics_mark_round_trips_through_an_alias():
    owner = marks.fabric_owner("1a2b3c4d")
    assert owner == "fabric-1a2b3c4d" and marks.is_fabric(owner)
    assert marks.interface_alias(owner) == f"{OWNER_KEY} fabric-1a2b3c4d"
    assert marks.owner_of_alias(marks.interface_alias(owner)) == owner
    assert marks.owner_of_external_id(owner) == owner


@pytest.mark.parametrize("alias, owner", [
    (f"{OWNER_KEY} hand-run", marks.HAND_RUN), (OWNER_KEY, marks.UNKNOWN), (f"{OWNER_KEY} 1", marks.UNKNOWN),
    (f"{OWNER_KEY} fabric-", marks.UNKNOWN), (f"{OWNER_KEY} fabric-AB", marks.UNKNOWN),
    (f"{OWNER_KEY}x fabric-1a", None), ("uplink", None), ("", None), (None, None)])
def test_aliases_name_an_owner_or_are_not_ours(alias, owner):
    assert marks.owner_of_alias(alias) == owner
    assert not marks.is_fabric(owner or "")


@pytest.mark.parametrize("fabric_id", ["", "AB", "1 2", "x;rm", "a/b"])
def test_a_fabric_id_that_cannot_be_a_mark_is_refused(fabric_id):
    with pytest.raises(ValueError, match="fabric id: "):
        marks.fabric_owner(fabric_id)


def test_our_classes_mark_what_they_make_hand_run_unless_told():
    for function in (OVSUserSwitch.__init__, ShapedIntf.config):
        assert inspect.signature(function).parameters["owner"].default == marks.HAND_RUN


@pytest.mark.parametrize("topo", [LeafSpineTopo(spines=2, leaves=3, hosts_per_leaf=2), FatTreeTopo(k=4)])
def test_a_claimed_topo_gives_every_switch_and_link_its_owner(topo):
    assert all("owner" not in topo.nodeInfo(switch) for switch in topo.switches()), "mn builds it hand-run"
    topo.claim("fabric-1a2b")
    assert {topo.nodeInfo(switch)["owner"] for switch in topo.switches()} == {"fabric-1a2b"}
    assert all("owner" not in topo.nodeInfo(host) for host in topo.hosts())
    assert {info["owner"] for _, _, info in topo.links(withInfo=True)} == {"fabric-1a2b"}
