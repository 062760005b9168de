"""What the controller knows about the fabric: switches, their ports, links and hosts.

Plain data, no OpenFlow: the Ryu app feeds events in and reads the view out. Every mutator
returns whether the view changed, so the app recomputes only when something did.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Host:
    ip: str
    mac: str
    dpid: int
    port: int


@dataclass
class Switch:
    dpid: int
    name: str
    # port number -> (interface name, link up)
    ports: dict[int, tuple[str, bool]] = field(default_factory=dict)

    def live_ports(self) -> set[int]:
        return {p for p, (_, up) in self.ports.items() if up}


class FabricView:
    def __init__(self) -> None:
        self.switches: dict[int, Switch] = {}
        # (dpid, port) -> (peer dpid, peer port); stored both ways
        self.links: dict[tuple[int, int], tuple[int, int]] = {}
        self.hosts: dict[str, Host] = {}
        # Hosts known in advance (the runner's hosts file): they are where they are said to be, and
        # come back whenever their port does. A packet seen elsewhere (on an uplink whose link is
        # not discovered yet, as right after a controller restart) does not move them.
        self.pinned: dict[str, Host] = {}

    # -- switches and ports ---------------------------------------------------------------
    def add_switch(self, dpid: int, name: str, ports: dict[int, tuple[str, bool]]) -> bool:
        """A switch (re)connected: whatever we knew of it is forgotten (it may be a new fabric
        reusing the DPID with another shape), but its pinned hosts."""
        self.remove_switch(dpid)
        self.switches[dpid] = Switch(dpid, name, dict(ports))
        self._restore_pinned(dpid)
        return True

    def pin_host(self, host: Host) -> bool:
        """Know `host` in advance (see `pinned`); learnt now if its port is up."""
        self.pinned[host.ip] = host
        return self._restore_pinned(host.dpid)

    def _restore_pinned(self, dpid: int, port: int | None = None) -> bool:
        changed = False
        for host in self.pinned.values():
            if host.dpid == dpid and port in (None, host.port) and self.hosts.get(host.ip) != host:
                if self.port_up(host.dpid, host.port) and not self.is_fabric_port(host.dpid, host.port):
                    self.hosts[host.ip] = host
                    changed = True
        return changed

    def remove_switch(self, dpid: int) -> bool:
        if dpid not in self.switches:
            return False
        del self.switches[dpid]
        for end in [e for e in self.links if e[0] == dpid]:
            self._unlink(end)
        for ip in [ip for ip, h in self.hosts.items() if h.dpid == dpid]:
            del self.hosts[ip]
        return True

    def set_port(self, dpid: int, port: int, name: str, up: bool) -> bool:
        """A port was added, changed state or (up=False) is down or gone."""
        switch = self.switches.get(dpid)
        if switch is None:
            return False
        changed = switch.ports.get(port) != (name, up)
        switch.ports[port] = (name, up)
        if not up:
            changed |= self._unlink((dpid, port))
            for ip in [ip for ip, h in self.hosts.items() if (h.dpid, h.port) == (dpid, port)]:
                del self.hosts[ip]
                changed = True
        else:
            changed |= self._restore_pinned(dpid, port)
        return changed

    def delete_port(self, dpid: int, port: int) -> bool:
        if port not in getattr(self.switches.get(dpid), "ports", {}):
            return False
        self.set_port(dpid, port, "", False)
        del self.switches[dpid].ports[port]
        return True

    def port_up(self, dpid: int, port: int) -> bool:
        switch = self.switches.get(dpid)
        return switch is not None and switch.ports.get(port, ("", False))[1]

    # -- links ----------------------------------------------------------------------------
    def add_link(self, a: tuple[int, int], b: tuple[int, int]) -> bool:
        """A probe sent from a=(dpid, port) arrived at b. Ignored unless both ends are live."""
        if not (self.port_up(*a) and self.port_up(*b)) or a == b:
            return False
        if self.links.get(a) == b:
            return False
        self._unlink(a)
        self._unlink(b)
        self.links[a] = b
        self.links[b] = a
        # A port that leads to a switch has no hosts: anything learnt there came through it.
        for ip in [ip for ip, h in self.hosts.items() if (h.dpid, h.port) in (a, b)]:
            del self.hosts[ip]
        return True

    def _unlink(self, end: tuple[int, int]) -> bool:
        peer = self.links.pop(end, None)
        if peer is None:
            return False
        self.links.pop(peer, None)
        return True

    def is_fabric_port(self, dpid: int, port: int) -> bool:
        return (dpid, port) in self.links

    def edge_ports(self, dpid: int) -> list[int]:
        """Live ports that lead to no switch we know: where hosts are (and where floods go)."""
        switch = self.switches.get(dpid)
        if switch is None:
            return []
        return sorted(p for p in switch.live_ports() if (dpid, p) not in self.links)

    def neighbours(self, dpid: int) -> list[tuple[int, int]]:
        """(local port, peer dpid) of every live link of `dpid`."""
        return sorted((port, peer[0]) for (d, port), peer in self.links.items()
                      if d == dpid and peer[0] in self.switches)

    # -- hosts ----------------------------------------------------------------------------
    def learn_host(self, ip: str, mac: str, dpid: int, port: int) -> bool:
        """A host spoke on (dpid, port). Only edge ports teach: floods cross fabric ports. A pinned
        host stays where it is pinned."""
        if not self.port_up(dpid, port) or self.is_fabric_port(dpid, port):
            return False
        if ip in self.pinned and (self.pinned[ip].dpid, self.pinned[ip].port) != (dpid, port):
            return False
        host = Host(ip, mac, dpid, port)
        if self.hosts.get(ip) == host:
            return False
        self.hosts[ip] = host
        return True
