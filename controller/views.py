"""What the REST API shows (controller/rest.py), as functions of the controller's plain state."""
from __future__ import annotations

from typing import Iterable, Iterator, Mapping, Sequence

from controller.paths import PinnedPath
from controller.priority import FlowClass, ingress_switch
from controller.routing import SwitchPlan
from controller.scheduling import RegisteredJob, describe_job, sharing_of
from controller.topology import FabricView


def describe(view: FabricView, lb: str, errors: int) -> dict:
    """GET /fabric: the LB mode, the error count, switches with their ports, links, hosts."""
    name = {d: s.name for d, s in view.switches.items()}
    return {
        "lb": lb,
        "errors": errors,
        "switches": [{"dpid": f"{d:016x}", "name": s.name, "ports": {
            str(p): {"name": n, "up": up, "peer": peer_name(view, d, p, name)}
            for p, (n, up) in sorted(s.ports.items())}} for d, s in sorted(view.switches.items())],
        "links": sorted({tuple(sorted([(name.get(a[0], a[0]), a[1]), (name.get(b[0], b[0]), b[1])]))
                         for a, b in view.links.items()}),
        "hosts": [{"ip": h.ip, "mac": h.mac, "switch": name.get(h.dpid), "port": h.port}
                  for h in sorted(view.hosts.values(), key=lambda h: (h.dpid, h.port))],
    }


def peer_name(view: FabricView, dpid: int, port: int, name: Mapping[int, str]) -> str | None:
    """What a port leads to: "<switch>:<port>", a host's address, or None."""
    peer = view.links.get((dpid, port))
    if peer:
        return f"{name.get(peer[0])}:{peer[1]}"
    return next((h.ip for h in view.hosts.values() if (h.dpid, h.port) == (dpid, port)), None)


def describe_groups(view: FabricView, installed: Mapping[int, SwitchPlan],
                    group_stats: Mapping[int, Mapping[int, list[int]]]) -> dict:
    """GET /fabric/groups: each switch's installed select groups, with the latest packet count
    of each bucket (None before the first statistics)."""
    return {view.switches[d].name: [
        {"group_id": g.group_id, "ports": list(g.ports),
         "selection_method": g.selection_method,
         "bucket_packets": group_stats.get(d, {}).get(g.group_id)}
        for g in sorted(plan.groups.values(), key=lambda g: g.group_id)]
        for d, plan in installed.items() if d in view.switches}


def describe_ports(port_stats: Mapping[int, Mapping[int, dict]]) -> list[dict]:
    """GET /fabric/ports: the latest statistics row of every port."""
    return [row for ports in port_stats.values() for row in ports.values()]


def describe_flow_classes(view: FabricView, flows: Iterable[FlowClass]) -> list[dict]:
    """GET /fabric/classes: each REST mark and the switch it is installed on (None: its source
    is not learnt yet)."""
    return [{**f.to_dict(), "switch": (view.switches[d].name
                                       if (d := ingress_switch(view, f)) in view.switches
                                       else None)} for f in flows]


def describe_jobs(jobs: Iterable[RegisteredJob], view: FabricView | None = None,
                  paths: Sequence[PinnedPath] = (), only: str | None = None) -> Iterator[dict]:
    """GET /jobs: each job (or the one whose id is `only`), one at a time (REST yields in between), in
    its band and with its start offset under the jobs' sharing policy; under one that chooses paths,
    each job's pinned paths."""
    jobs = list(jobs)
    shared = sharing_of(jobs)
    by_job: dict[str, list[dict]] = {}
    for path in paths:
        by_job.setdefault(path.job, []).append(describe_path(view, path))
    return ({**describe_job(job, shared), **({"paths": by_job.get(job.job, [])} if shared.chooses_paths else {})}
            for job in jobs if only is None or job.job == only)


def describe_path(view: FabricView | None, path: PinnedPath) -> dict:
    """A pinned path: its ends and the switches it crosses, by name."""
    dpids = [dpid for dpid, _ in path.hops]
    if view is not None and path.hops:
        dpids.append(view.links[path.hops[-1]][0])
    names = [view.switches[dpid].name if view is not None and dpid in view.switches else f"{dpid:016x}"
             for dpid in dpids]
    return {"src": path.src, "dst": path.dst, "via": names}
