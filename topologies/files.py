"""Fabrics described by a file (`topology: {file: PATH}` in a spec, `--topo file,path=PATH` for `mn`): its
switches tier by tier, the hosts on each leaf, and the links between switches, with their rates, in a
small YAML (or JSON) document declared on the schema engine (common/schema.py). It gives a layout
(topologies/layout.py) like the built-in kinds', with their conventions:

    description: a 2x2 leaf-spine with two hosts per leaf   # text, optional
    switches: {spine: 2, leaf: 2}    # switches per tier: spine1, spine2, leaf1, leaf2
    hosts: {leaf1: 2, leaf2: 2}      # hosts per leaf: h1, h2 on leaf1, h3, h4 on leaf2
    links:
      - {a: leaf1..leaf2, b: spine1..spine2}   # every a to every b: leaf1-spine1, leaf1-spine2, leaf2-...
      - {a: leaf3, b: spine2, speed: 0.5}      # at half the fabric's rate

Tiers: hosts hang off `leaf` (or `edge`) switches; `spine` (or `core`) and `agg` switches carry the rest.
Leaves and edges share the DPIDs 0x1000+i, spines and cores 0x2000+i, so a file names one of each pair.
Hosts are h1..hN switch by switch; a switch's ports face its hosts first, then its links in the order
the file lists them (a list or range `x1..x4` in a or b links each of its switches in turn). Host links
run at the fabric's host rate (a spec's topology.host_bw), switch links at its fabric rate
(topology.fabric_bw) times their `speed`. The built-in kinds written so give their own layouts.
"""
from __future__ import annotations

import functools
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.paths import REPO
from common.schema import SchemaError, build, knob, section, show
from topologies.layout import HOST_ROLE, LEAF_ROLES, MAX_HOSTS, MAX_PER_TIER, Layout, Link, Node

MAX_FILE_BYTES = 1 << 20
MAX_LINKS = 1 << 16  # switch links once lists and ranges are expanded
MAX_SPEED = 100.0
RANGE = re.compile(r"([a-z]+)([1-9][0-9]*)\.\.([a-z]+)([1-9][0-9]*)")
NAMED = re.compile(r"([a-z]+)([1-9][0-9]*)")
SWITCHES = "a switch of the file or a list of them, or a range such as leaf1..leaf4"
# Tiers top to bottom, as the layout lists them; each pair in one tuple shares its DPIDs.
TIERS = (("spine", "core"), ("agg",), LEAF_ROLES)


class FabricFileError(ValueError):
    """A file that describes no fabric: one line naming the field of the file (`links.2.b: ...`)."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path, self.problem = path, problem


def _count(n: int) -> bool:
    return 0 <= n <= MAX_PER_TIER


@dataclass(frozen=True)
class Switches:
    """Switches per tier, numbered from 1 in each: spine1, spine2, ..."""
    spine: int = knob(0, f"a count 0..{MAX_PER_TIER} (the DPIDs of a tier)", _count)
    core: int = knob(0, f"a count 0..{MAX_PER_TIER} (the DPIDs of a tier)", _count)
    agg: int = knob(0, f"a count 0..{MAX_PER_TIER} (the DPIDs of a tier)", _count)
    leaf: int = knob(0, f"a count 0..{MAX_PER_TIER} (the DPIDs of a tier)", _count)
    edge: int = knob(0, f"a count 0..{MAX_PER_TIER} (the DPIDs of a tier)", _count)


@dataclass(frozen=True)
class FileLink:
    """Links between switches: each switch of a to each of b."""
    a: str | list[str] = knob(allowed=SWITCHES)
    b: str | list[str] = knob(allowed=SWITCHES)
    speed: float = knob(1.0, f"a multiple of the fabric's rate, > 0 and at most {MAX_SPEED:g}",
                        lambda x: 0 < x <= MAX_SPEED)


@dataclass(frozen=True, kw_only=True)
class FabricFile:
    description: str = knob("", "text")
    switches: Switches = section(Switches)
    hosts: dict = knob(allowed="a mapping of leaf (or edge) switches to their host counts, e.g. {leaf1: 2, leaf2: 2}")
    links: list[FileLink] = knob([], "a list of links between switches, {a: ..., b: ..., speed: ...}")


class _Loader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode)]
        twice = next((key for index, key in enumerate(keys) if key in keys[:index]), None)
        if twice is not None:
            raise yaml.constructor.ConstructorError(None, None, f"found the key {twice!r} twice", node.start_mark)
        return super().construct_mapping(node, deep)


def fabric_path(text: str) -> Path:
    """Where a fabric file named in a spec or on mn's command line is: relative from the repository root."""
    path = Path(text).expanduser()
    return path if path.is_absolute() else REPO / path


def read_fabric(text: str) -> Layout:
    """The layout of the fabric file at `text`; FabricFileError names the field that is wrong."""
    path = fabric_path(text)
    try:
        status = path.stat()
    except OSError as error:
        raise FabricFileError("", f"cannot be read ({error.strerror or error})") from None
    return _read_fabric(str(path), status.st_mtime_ns, status.st_size)


@functools.lru_cache(maxsize=16)
def _read_fabric(path: str, mtime_ns: int, size: int) -> Layout:
    """Cached by the file's path, modification time and size: a spec names its nodes many times."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise FabricFileError("", f"cannot be read ({error.strerror or error})") from None
    if len(data) > MAX_FILE_BYTES:
        raise FabricFileError("", f"is more than {MAX_FILE_BYTES >> 20} MiB, too large for a fabric file")
    try:
        document = yaml.load(data.decode(), Loader=_Loader)
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as error:
        raise FabricFileError("", f"is not YAML ({' '.join(str(error).split())})") from None
    return fabric_layout(document)


def fabric_layout(document: object) -> Layout:
    """The layout a fabric file's document describes (see the module's docstring)."""
    try:
        fabric = build(FabricFile, document)
    except SchemaError as error:
        raise FabricFileError(error.path, error.problem) from None
    counts = fabric.switches
    for pair in TIERS:
        given = [role for role in pair if getattr(counts, role)]
        if len(given) > 1:
            raise FabricFileError(f"switches.{given[1]}", f"{getattr(counts, given[1])} is not allowed (0 with "
                                  f"{given[0]} switches: they share DPIDs, a file has one of {' and '.join(pair)})")
    switches = [Node(f"{role}{n}", role, n) for pair in TIERS for role in pair
                for n in range(1, getattr(counts, role) + 1)]
    if not any(node.role in LEAF_ROLES for node in switches):
        raise FabricFileError("switches", f"{show(document.get('switches') if isinstance(document, dict) else None)} "
                              "is not allowed (at least one leaf or edge switch, which hosts hang off)")
    by_name = {node.name: node for node in switches}
    hosts_on = _hosts(fabric.hosts, by_name)
    pairs = _links(fabric.links, by_name)
    nodes, host_links, number = [], {}, 0
    for switch in switches:
        nodes.append(switch)
        for port in range(1, hosts_on.get(switch.name, 0) + 1):
            number += 1
            host = Node(f"h{number}", HOST_ROLE, number)
            nodes.append(host)
            host_links.setdefault(switch.name, []).append(Link(switch, port, host, 0))
    ports = {name: count for name, count in hosts_on.items()}
    links: list[Link] = []
    for a, b, speed in pairs:
        for end in (a, b):  # a leaf's host links come just before its first switch link, as the built-ins list them
            links += host_links.pop(end.name, [])
        ports[a.name] = ports.get(a.name, 0) + 1
        ports[b.name] = ports.get(b.name, 0) + 1
        links.append(Link(a, ports[a.name], b, ports[b.name], speed))
    links += [link for switch in switches for link in host_links.pop(switch.name, [])]
    layout = Layout(tuple(nodes), tuple(links))
    _check_connected(layout)
    return layout


def _hosts(hosts: dict, by_name: dict[str, Node]) -> dict[str, int]:
    leaves = [node for node in by_name.values() if node.role in LEAF_ROLES]
    allowed = f"a leaf or edge switch of the file ({leaves[0].name}..{leaves[-1].name})"
    total = 0
    for name, count in hosts.items():
        if name not in by_name or by_name[name].role not in LEAF_ROLES:
            raise FabricFileError(f"hosts.{show(name) if not isinstance(name, str) else name}",
                                  f"unknown switch (hosts hang off {allowed})")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise FabricFileError(f"hosts.{name}", f"{show(count)} is not allowed (a count of hosts >= 1)")
        total += count
        if total > MAX_HOSTS:
            raise FabricFileError(f"hosts.{name}", f"{count} is not allowed (at most {MAX_HOSTS} hosts in all, the "
                                  "addresses of 10.0.0.0/8)")
    if not total:
        raise FabricFileError("hosts", f"{show(hosts)} is not allowed (at least one host, on {allowed})")
    return hosts


def _names(value: str | list[str], path: str, by_name: dict[str, Node]) -> list[Node]:
    """The switches an end of a link names (one, a list or a range), each once."""
    def refuse(shown: object) -> FabricFileError:
        return FabricFileError(path, f"{show(shown)} is not allowed ({SWITCHES})")

    names: list[str] = []
    for item in [value] if isinstance(value, str) else value:
        if not isinstance(item, str):
            raise refuse(item)
        ranged = RANGE.fullmatch(item)
        if ranged:
            first, last = int(ranged[2]), int(ranged[4])
            if ranged[1] != ranged[3] or first > last or f"{ranged[1]}{last}" not in by_name:
                raise refuse(item)
            names += [f"{ranged[1]}{n}" for n in range(first, last + 1)]
        else:
            names.append(item)
    if not names or len(set(names)) != len(names):
        raise refuse(value)
    for name in names:
        if name not in by_name:
            raise refuse(name)
    return [by_name[name] for name in names]


def _links(links: list[FileLink], by_name: dict[str, Node]) -> list[tuple[Node, Node, float]]:
    total = 0
    ends = []
    for index, link in enumerate(links):
        a, b = _names(link.a, f"links.{index}.a", by_name), _names(link.b, f"links.{index}.b", by_name)
        total += len(a) * len(b)
        if total > MAX_LINKS:
            raise FabricFileError(f"links.{index}", f"makes more than {MAX_LINKS} links")
        ends.append((a, b, link.speed))
    pairs, seen = [], {}
    for index, (a, b, speed) in enumerate(ends):
        for one in a:
            for other in b:
                key = frozenset((one.name, other.name))
                if one is other:
                    raise FabricFileError(f"links.{index}", f"links {one.name} to itself")
                if key in seen:
                    again = "" if seen[key] == index else f" (links.{seen[key]} too)"
                    raise FabricFileError(f"links.{index}", f"links {one.name} and {other.name} twice{again}: a fabric "
                                          "file has one link between two switches")
                seen[key] = index
                pairs.append((one, other, speed))
    return pairs


def _check_connected(layout: Layout) -> None:
    """Every switch and host reaches every other: else pingall fails and the controller has no path."""
    neighbours: dict[str, list[str]] = {node.name: [] for node in layout.nodes}
    for link in layout.links:
        neighbours[link.a.name].append(link.b.name)
        neighbours[link.b.name].append(link.a.name)
    start = layout.hosts[0].name
    reached, queue = {start}, deque([start])
    while queue:
        for peer in neighbours[queue.popleft()]:
            if peer not in reached:
                reached.add(peer)
                queue.append(peer)
    apart = [node.name for node in layout.nodes if node.name not in reached]
    if apart:
        shown = ", ".join(apart[:4]) + (f" and {len(apart) - 4} more" if len(apart) > 4 else "")
        raise FabricFileError("links", f"{shown} cannot reach {start}: every switch and host must reach the others")
