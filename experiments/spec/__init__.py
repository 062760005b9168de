"""Experiment specs: YAML files read within limits (reading), on the declared schema (schema), with
rules across fields (topology, checks), `--set` overrides (overrides) and a matrix (matrix) expanded
into runs (runs). `load_spec` checks everything before any network state exists and fails with one
line naming the field:

    spec error: topology.spines: 5000 is not allowed (at most 4095 spine switches, the DPIDs of one tier)

What each run will then do, and the checks only that can tell, is experiments/runplan.py's.
"""
from experiments.spec.checks import check_config, get_field
from experiments.spec.errors import SpecError, not_allowed
from experiments.spec.matrix import Axis
from experiments.spec.reading import YamlLimitError, load_yaml
from experiments.spec.runs import ALONE, Run, Spec, alone_runs, load_spec, parse_spec, run_id, scheme_of
from experiments.spec.schema import FLOW_PORTS, Cluster, Controller, Fault, Flow, Header, Job, JobEntry, RunConfig, \
    Topology
from experiments.spec.topology import host_names, layout_of, topology_links

__all__ = ["ALONE", "FLOW_PORTS", "Axis", "JobEntry", "alone_runs", "Cluster", "Controller", "Fault", "Flow",
           "Header", "Job", "Run", "RunConfig", "Spec", "SpecError", "Topology", "YamlLimitError", "check_config",
           "get_field", "host_names", "layout_of", "load_spec", "load_yaml", "not_allowed", "parse_spec", "run_id",
           "scheme_of", "topology_links"]
