"""Emulated datacenter fabrics as Mininet describes them: the layouts (`layout.py`), the Topo
classes and their registry (`leafspine.py`), the node and link classes they carry (`nodes.py`),
every port's class queues (`shaping.py`), the hosts' TCP congestion control (`tcp.py`) and
where nodes land on several servers (`cluster.py`). Nothing here starts a network: that is
emulation/."""
