"""Reading a flow's bucket from the group counters of its first switch (the probe itself runs in
tests/integration/test_placement.py)."""
import pytest
from hypothesis import given, strategies as st

from emulation.placement import Placed, bucket_counts, bucket_ports, decode, summary

GROUPS = """OFPST_GROUP_DESC reply (OF1.5) (xid=0x2):
 group_id=2147483650,type=select,selection_method=dp_hash,bucket=bucket_id:0,watch_port:5,actions=output:5,bucket=bucket_id:1,watch_port:6,actions=output:6
 group_id=2147483651,type=select,selection_method=dp_hash,bucket=bucket_id:0,watch_port:6,actions=output:6,bucket=bucket_id:1,watch_port:5,actions=output:5
"""
STATS = """OFPST_GROUP reply (OF1.5) (xid=0x2):
 group_id=2147483650,duration=3.1s,ref_count=2,packet_count=13,byte_count=910,bucket0:packet_count=5,byte_count=350,bucket1:packet_count=8,byte_count=560
 group_id=2147483651,duration=3.1s,ref_count=1,packet_count=2,byte_count=140,bucket0:packet_count=2,byte_count=140,bucket1:packet_count=0,byte_count=0
"""


def test_buckets_are_read_with_their_ports_and_counters():
    assert bucket_ports(GROUPS) == {(2147483650, 0): 5, (2147483650, 1): 6, (2147483651, 0): 6, (2147483651, 1): 5}
    assert bucket_counts(STATS) == {(2147483650, 0): 5, (2147483650, 1): 8, (2147483651, 0): 2,
                                    (2147483651, 1): 0}


@given(st.lists(st.sampled_from([5, 6, 7, None]), min_size=1, max_size=8))
def test_the_counts_name_each_flow_s_port(ports):
    deltas: dict[int, int] = {5: 0, 6: 0, 7: 0}
    for index, port in enumerate(ports):
        if port is not None:
            deltas[port] += 1 << index
    assert decode(deltas, len(ports)) == dict(enumerate(ports))


def test_other_traffic_is_told_apart_from_the_probes():
    with pytest.raises(ValueError, match="moved by more than the probes sent"):
        decode({5: 8, 6: 0}, 3)  # at most 7 packets were sent


def test_the_summary_counts_flows_per_uplink():
    placed = [Placed("w0->w1", "leaf1", "spine1"), Placed("w1->w0", "leaf2", "spine2"),
              Placed("w0->w4", "leaf1", "spine1"), Placed("w2->w3", "leaf1", "")]
    assert summary(placed) == {"uplinks": {"leaf1": {"spine1": ["w0->w1", "w0->w4"]}, "leaf2": {"spine2": ["w1->w0"]}},
                               "max_flows_per_uplink": 2}
