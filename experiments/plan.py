"""`python -m experiments plan SPEC`: where a spec's fabrics land and what crosses between servers.

For each fabric the runs share: which server each node lands on (topologies/cluster.py, the
placement the run will use), the links that cross servers (each a gretap tunnel over the machines'
own network), and for each run the bytes one iteration sends over those links, with the rate they
need when an iteration runs at its analytical bound: what the servers' network must carry. The
traffic is the job's own (experiments/traffic.py).
"""
from __future__ import annotations

import itertools

from controller.paths import choose_paths
from controller.scheduling import parse_job
from controller.sharing import SHARING_POLICIES
from controller.topology import FabricView
from experiments.runplan import RunPlan, data_flows, fabric_key
from experiments.spec import layout_of
from experiments.traffic import link_traffic
from topologies.cluster import LOCAL, crossing_links, placement
from topologies.layout import Layout


def plan_text(name: str, plans: list[RunPlan]) -> str:
    """What `plan` prints: per fabric its placement and crossing links, per run its crossing traffic."""
    fabrics = [list(runs) for _, runs in itertools.groupby(plans, lambda plan: fabric_key(plan.run))]
    lines = [f"{name}: {len(plans)} runs on {len(fabrics)} fabric(s)"]
    for number, runs in enumerate(fabrics, start=1):
        config = runs[0].run.config
        layout = layout_of(config.topology)
        servers = config.cluster.servers or [LOCAL]
        where = placement(layout, servers, config.cluster.placement)
        crossing = crossing_links(layout, where)
        topology = config.topology
        shape = {"fattree": f"k={topology.k} fat-tree", "file": f"fabric file {topology.file}"}.get(
            topology.kind, f"{topology.spines}x{topology.leaves}x{topology.hosts_per_leaf} leaf-spine")
        lines += ["", f"fabric {number}: {shape}, {len(layout.hosts)} hosts, {len(layout.switches)} switches; "
                  f"placement {config.cluster.placement} on {len(servers)} server(s)"]
        width = max(map(len, servers))
        for server in servers:
            names = [name for name in where if where[name] == server]
            switches = [name for name in names if layout.node(name).is_switch]
            lines.append(f"  {server:<{width}}  {len(switches)} switches, {len(names) - len(switches)} hosts: "
                         f"{' '.join(names)}")
        shown = ", ".join(f"{link.a.name}-{link.b.name}" for link in crossing[:12])
        more = f" and {len(crossing) - 12} more" if len(crossing) > 12 else ""
        lines.append(f"  links crossing servers: {len(crossing)} of {len(layout.links)}"
                     + (f" ({shown}{more})" if crossing else ""))
        crossing_keys = {link.names for link in crossing}
        lines.append("  run: bytes per iteration over crossing links (busiest link) -> Mbit/s at the bound")
        run_width = max(len(label(plan)) for plan in runs)
        for plan in runs:
            carried = link_traffic(plan.run, plan.layer_sizes)
            across = {link: sent for link, sent in carried.items() if link in crossing_keys}
            total, busiest = sum(across.values()), max(across.values(), default=0.0)
            bound = plan.lower_bound_s
            if bound:
                rates = f"{total * 8 / bound / 1e6:8.1f} Mbit/s ({busiest * 8 / bound / 1e6:.1f})"
            else:  # a job that sends nothing (one worker's all-reduce)
                rates = f"{'-':>8} Mbit/s (-)"
            lines.append(f"  {label(plan):<{run_width}}  {total / 1e6:8.2f} MB ({busiest / 1e6:.2f} MB)"
                         f" -> {rates} in {bound * 1e3:.1f} ms")
        for _, together in itertools.groupby(runs, lambda plan: plan.run.run_id):
            together = list(together)
            lines += jobs_text(together) + paths_text(together)
    return "\n".join(lines)


def label(plan: RunPlan) -> str:
    return f"{plan.run.run_id} [{plan.name}]" if plan.name else plan.run.run_id


def jobs_text(plans: list[RunPlan]) -> list[str]:
    """For a run of several jobs: each job's hosts, its busiest link and the bytes one iteration puts
    on it, and the links two jobs' traffic share (where they contend)."""
    if len(plans) < 2:
        return []
    lines = [f"  {plans[0].run.run_id}: {len(plans)} jobs"]
    users: dict[frozenset, list[str]] = {}
    for plan in plans:
        config = plan.run.config
        carried = link_traffic(plan.run, plan.layer_sizes)
        busiest = max(carried, key=carried.get, default=None)
        where = "-" if busiest is None else f"{'-'.join(sorted(busiest))} {carried[busiest] / 1e6:.2f} MB"
        servers = f" servers {','.join(config.server_hosts)}" if config.server_hosts else ""
        flows = [flow.what for flow in data_flows(plan.run) if not flow.what.startswith("flow")]  # not background
        lines.append(f"    {plan.name}: {config.job.mode} {config.job.model.name} {config.job.transport}, workers "
                     f"{','.join(config.worker_hosts)}{servers}; start {plan.start_s:g} s; {len(flows)} flows "
                     f"({', '.join(flows[:4])}{' ...' if len(flows) > 4 else ''}) over {len(carried)} links, "
                     f"busiest {where}, {plan.bounds['link_bound_s'] * 1e3:.1f} ms at its rate")
        for link in carried:
            users.setdefault(link, []).append(plan.name)
    shared = {link: names for link, names in users.items() if len(names) > 1}
    shown = ", ".join(f"{'-'.join(sorted(link))} ({'+'.join(names)})"
                      for link, names in sorted(shared.items(), key=lambda item: sorted(item[0])))
    lines.append(f"    links shared by jobs: {len(shared)}" + (f": {shown}" if shared else ""))
    return lines


def paths_text(plans: list[RunPlan]) -> list[str]:
    """Under a sharing policy that chooses paths: the paths the controller will pin each job's host
    pairs to (controller/paths.py, on the fabric as the controller learns it), by switch names."""
    run = plans[0].run if plans else None
    if run is None or not SHARING_POLICIES[run.controller.sharing].chooses_paths or \
            any(plan.document is None for plan in plans):
        return []
    layout = layout_of(run.topology)
    host = {node.ip: node.name for node in layout.hosts}
    switch = {node.dpid: node.name for node in layout.switches}
    chosen = choose_paths(fabric_view(layout), [parse_job(plan.document) for plan in plans])
    name = {plan.job_id: plan.name or plan.job_id for plan in plans}
    lines = [f"  {run.run_id}: paths pinned by {run.controller.sharing}, the most intense job first"]
    for job_id in dict.fromkeys(path.job for path in chosen):
        pairs = [f"{host[path.src]}->{host[path.dst]} via {'-'.join(switch[dpid] for dpid, _ in path.hops[1:])}"
                 for path in chosen if path.job == job_id]
        lines.append(f"    {name[job_id]}: {', '.join(pairs)}")
    return lines


def fabric_view(layout: Layout) -> FabricView:
    """The fabric as the controller learns it: its switches, their links and ports, its hosts."""
    view = FabricView()
    for node in layout.switches:
        view.add_switch(node.dpid, node.name, {port: (layout.interface(node.name, port), True)
                                               for port in layout.ports(node.name)})
    for link in layout.links:
        if link.a.is_switch and link.b.is_switch:
            view.add_link((link.a.dpid, link.port_a), (link.b.dpid, link.port_b))
        else:
            (host, _), (switch, port) = sorted([(link.a, link.port_a), (link.b, link.port_b)],
                                               key=lambda end: end[0].is_switch)
            view.learn_host(host.ip, host.mac, switch.dpid, port)
    return view
