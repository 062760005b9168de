"""All-reduce algorithms, each a registered schedule (schedule.py) that one executor runs.

A job's `collective` names one of `ALLREDUCES`: ring (ring.py), halving_doubling (halving_doubling.py),
tree (tree.py: NCCL's double binary tree) or hierarchical (hierarchical.py: within leaves, across them,
back). A new algorithm is a module here whose AllReduce subclass is decorated with
@register_allreduce(name), imported below: the spec's and the command line's choices, the host apps,
the runner's bounds and host traffic (experiments/traffic.py) all read the registry.
"""
from hostapps.allreduce.schedule import (ALLREDUCES, GATHER, PHASES, REDUCE, STEP_VALUES, AllReduce,
                                         PeerSenders, Round, Segment, Transfer, allreduce_names, chunk_bounds,
                                         make_allreduce, register_allreduce, run_allreduce)
from hostapps.allreduce.ring import Ring, ring_allreduce, ring_neighbours, ring_phase
from hostapps.allreduce import halving_doubling, hierarchical, tree  # noqa: F401 (each registers itself)

__all__ = ["ALLREDUCES", "GATHER", "PHASES", "REDUCE", "STEP_VALUES", "AllReduce", "PeerSenders", "Ring", "Round",
           "Segment", "Transfer", "allreduce_names", "chunk_bounds", "make_allreduce", "register_allreduce",
           "ring_allreduce", "ring_neighbours", "ring_phase", "run_allreduce"]
