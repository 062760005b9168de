"""TCP source ports drawn from a run's seed: every scheme's run of a repetition places its flows alike."""

from experiments.runplan import process_config
from experiments.source_ports import BLOCK_PORTS, BLOCKS, FIRST_PORT, run_source_ports, source_port_blocks
from experiments.spec import load_spec
from helpers import FIXTURES, REPO

TWO_SCHEMES = FIXTURES / "experiments" / "two_schemes.yaml"


def test_blocks_are_distinct_below_the_ephemeral_range_and_follow_the_seed():
    blocks = source_port_blocks(7, 40)
    assert blocks == source_port_blocks(7, 40) and blocks != source_port_blocks(8, 40)
    assert len(set(blocks)) == 40
    assert all(FIRST_PORT <= block and block + BLOCK_PORTS <= 32768 and (block - FIRST_PORT) % BLOCK_PORTS == 0
               for block in blocks)
    assert source_port_blocks(7, BLOCKS + 2)[-2:] == [0, 0]  # past the blocks: ephemeral ports


def _process_ports(run) -> list[int]:
    config = run.config
    ip = {host: f"10.0.0.{i + 1}" for i, host in enumerate(config.hosts)}
    roles = [("server", rank) for rank in range(len(config.server_hosts))]
    roles += [("worker", rank) for rank in range(len(config.worker_hosts))]
    return [process_config(run, role, rank, ip).source_port for role, rank in roles]


def test_every_schemes_run_of_a_repetition_dials_its_peers_from_the_same_ports():
    runs = {run.run_id: run for run in load_spec(TWO_SCHEMES).runs}
    baseline = _process_ports(runs["scheme=baseline,mode=ps,rep=1"])
    assert len(baseline) == 4 and len(set(baseline)) == 4  # one server, three workers: a block each
    assert _process_ports(runs["scheme=spray,mode=ps,rep=1"]) == baseline
    assert _process_ports(runs["scheme=baseline,mode=ps,rep=2"]) != baseline  # another seed, another placement


def test_background_flow_clients_get_blocks_of_their_own_that_follow_the_seed():
    runs = {run.run_id: run for run in load_spec(REPO / "experiments" / "headline.yaml").runs}
    processes, clients = run_source_ports(runs["scheme=baseline,mode=allreduce,rep=1"].config)
    assert (len(processes), len(clients)) == (5, 2) and not set(processes) & set(clients)
    assert run_source_ports(runs["scheme=priority,mode=allreduce,rep=1"].config) == (processes, clients)
    assert run_source_ports(runs["scheme=baseline,mode=allreduce,rep=2"].config)[1] != clients


def test_mlt_sends_from_one_port_unless_the_fabric_sprays():
    """Under lb ecmp (or single) mlt's datagrams to a peer are one flow from the process's block, placed by
    the seed as TCP's are; under lb spray they leave from a pool, a port per datagram."""
    runs = {run.run_id: run for run in load_spec(REPO / "experiments" / "headline.yaml").runs}
    ip = {host: f"10.0.0.{i + 1}" for i, host in enumerate(runs["scheme=baseline,mode=ps,rep=1"].config.hosts)}
    per_flow = process_config(runs["scheme=mlt,mode=ps,rep=1"], "worker", 0, ip)
    assert per_flow.sport_range == 1 and per_flow.source_port == _process_ports(
        runs["scheme=baseline,mode=ps,rep=1"])[1]
    assert process_config(runs["scheme=spray,mode=ps,rep=1"], "worker", 0, ip).sport_range > 1
