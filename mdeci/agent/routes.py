"""Which local address reaches the broker, followed across interfaces (sans-IO).

The device's data address is the one the kernel would pick as the source of a packet to
the broker: Wi-Fi while the default route goes through Wi-Fi, cellular once it goes
through cellular. :class:`RoutingView` rebuilds that choice from a stream of typed
events (links, addresses and routes of the main table: what netlink's ``RTM_NEWLINK``,
``RTM_NEWADDR``/``RTM_DELADDR`` and ``RTM_NEWROUTE``/``RTM_DELROUTE`` say, or a dump
after :class:`Resync`); :class:`RouteFollower` turns it into moves. Nothing here reads a
socket: :mod:`mdeci.agent.ipmonitor` translates netlink messages into these events, and
the tests feed them by hand.

The lookup mirrors Linux's for the main table: the longest prefix containing the
destination, then the lowest metric, among routes whose interface is up with carrier
(ties: the route added first); the source is the route's ``prefsrc`` when an interface
holds it, else the interface's address in the gateway's (or the destination's) network,
else its lowest global address (an interface without one gives no source: the kernel
would borrow another interface's, which is no reason to move). Policy routing (other
tables, ``ip rule``) is not modelled.

Linux does not announce every route it drops: setting a link down flushes its IPv4
routes, and deleting an address flushes the routes that used it as ``prefsrc``, with no
``RTM_DELROUTE``. The view drops them itself on those events, so it agrees with the
kernel without a new dump.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class LinkChanged:
    """``RTM_NEWLINK``: ``up`` is ``IFF_UP`` (administratively up), ``carrier``
    ``IFF_LOWER_UP``. A route is used only through a link with both."""

    index: int
    name: str
    up: bool
    carrier: bool = True


@dataclass(frozen=True, slots=True)
class LinkRemoved:
    """``RTM_DELLINK``."""

    index: int


@dataclass(frozen=True, slots=True)
class AddrAdded:
    """``RTM_NEWADDR``: ``address`` with its prefix, ``"10.0.0.5/24"``."""

    index: int
    address: str


@dataclass(frozen=True, slots=True)
class AddrRemoved:
    """``RTM_DELADDR``."""

    index: int
    address: str


@dataclass(frozen=True, slots=True)
class Route:
    """A unicast route of the main table. ``dst`` is a network (``"0.0.0.0/0"``)."""

    dst: str
    oif: int
    gateway: str | None = None
    prefsrc: str | None = None
    metric: int = 0

    @property
    def network(self) -> IpNetwork:
        return ipaddress.ip_network(self.dst, strict=False)


@dataclass(frozen=True, slots=True)
class RouteAdded:
    """``RTM_NEWROUTE``; ``replace``: it replaced the route with the same dst and metric
    (``ip route replace``: the kernel sends no ``RTM_DELROUTE`` for the old one)."""

    route: Route
    replace: bool = False


@dataclass(frozen=True, slots=True)
class RouteRemoved:
    """``RTM_DELROUTE``."""

    route: Route


@dataclass(frozen=True, slots=True)
class Resync:
    """Forget everything: a full dump follows (start, or netlink lost events)."""


NetEvent = LinkChanged | LinkRemoved | AddrAdded | AddrRemoved | RouteAdded | RouteRemoved | Resync


def _version(text: str) -> int:
    return ipaddress.ip_interface(text).version


def is_held(host: str, addresses: frozenset[str]) -> bool:
    """Whether ``host`` is one of ``addresses`` or inside a loopback one's network.

    Only a loopback prefix makes its whole network local (Linux's ``local 127.0.0.0/8``
    route): after ``ip addr del 10.0.0.2/24; ip addr add 10.0.0.3/24`` the old address
    is gone although it lies in the new one's network.
    """
    ip = ipaddress.ip_address(host)
    for text in addresses:
        iface = ipaddress.ip_interface(text)
        if iface.ip == ip or (
            iface.ip.is_loopback and iface.version == ip.version and ip in iface.network
        ):
            return True
    return False


def pick_new(host: str, addresses: frozenset[str]) -> str | None:
    """The address to move to when ``host`` is no longer held, else None."""
    if is_held(host, addresses):
        return None
    version = ipaddress.ip_address(host).version
    candidates = sorted(
        (ipaddress.ip_interface(a).ip for a in addresses if _version(a) == version),
        key=lambda ip: (ip.is_loopback, ip.is_link_local, int(ip)),
    )
    return str(candidates[0]) if candidates else None


def _same_slot(a: Route, b: Route) -> bool:
    """Routes the kernel keeps apart only by their next hop (one replaces the other)."""
    return a.network == b.network and a.metric == b.metric


@dataclass(slots=True)
class RoutingView:
    """Links, addresses and main-table routes, as the events told them."""

    links: dict[int, LinkChanged] = field(default_factory=dict)
    addrs: dict[int, set[str]] = field(default_factory=dict)
    routes: list[Route] = field(default_factory=list)

    def apply(self, event: NetEvent) -> None:
        if isinstance(event, Resync):
            self.links.clear()
            self.addrs.clear()
            self.routes.clear()
        elif isinstance(event, LinkChanged):
            was = self.links.get(event.index)
            self.links[event.index] = event
            if was is not None and was.up and not event.up:
                # A link set down loses its routes in the kernel, silently; one that only
                # lost carrier keeps them (unusable until carrier is back).
                self._drop(lambda r: r.oif == event.index)
        elif isinstance(event, LinkRemoved):
            self.links.pop(event.index, None)
            self.addrs.pop(event.index, None)
            self._drop(lambda r: r.oif == event.index)
        elif isinstance(event, AddrAdded):
            self.addrs.setdefault(event.index, set()).add(event.address)
        elif isinstance(event, AddrRemoved):
            self.addrs.get(event.index, set()).discard(event.address)
            gone = ipaddress.ip_interface(event.address)
            self._drop(
                lambda r: (
                    (r.prefsrc is not None and ipaddress.ip_address(r.prefsrc) == gone.ip)
                    or (r.oif == event.index and r.gateway is None and r.network == gone.network)
                )
            )
        elif isinstance(event, RouteAdded):
            route = event.route
            if event.replace:
                self._drop(lambda r: _same_slot(r, route))
            else:
                self._drop(lambda r: r == route)
            self.routes.append(route)
        else:
            route = event.route
            self._drop(
                lambda r: (
                    _same_slot(r, route)
                    and r.oif == route.oif
                    and (route.gateway is None or r.gateway == route.gateway)
                )
            )

    def _drop(self, doomed: Callable[[Route], bool]) -> None:
        self.routes = [r for r in self.routes if not doomed(r)]

    def addresses(self, index: int | None = None) -> frozenset[str]:
        """Addresses with prefix of interface ``index`` (None: of every interface)."""
        if index is not None:
            return frozenset(self.addrs.get(index, ()))
        return frozenset(a for addrs in self.addrs.values() for a in addrs)

    def holder(self, host: str) -> int | None:
        """The interface holding ``host``, if any."""
        ip = ipaddress.ip_address(host)
        for index, addrs in self.addrs.items():
            if any(ipaddress.ip_interface(a).ip == ip for a in addrs):
                return index
        return None

    def _usable(self, route: Route) -> bool:
        link = self.links.get(route.oif)
        return link is not None and link.up and link.carrier

    def route_to(self, dest: str) -> Route | None:
        """The route the kernel would take to ``dest``, or None (unreachable)."""
        ip = ipaddress.ip_address(dest)
        candidates = [
            r
            for r in self.routes
            if r.network.version == ip.version and ip in r.network and self._usable(r)
        ]
        if not candidates:
            return None
        # Ties go to the route added first, as in the kernel's list of aliases.
        return min(candidates, key=lambda r: (-r.network.prefixlen, r.metric))

    def source_for(self, dest: str) -> str | None:
        """The source address the kernel would give a packet to ``dest``, or None (no
        route, or ``dest`` is local: the local table is not modelled)."""
        if is_held(dest, self.addresses()):
            return None
        route = self.route_to(dest)
        if route is None:
            return None
        if route.prefsrc is not None and self.holder(route.prefsrc) is not None:
            return route.prefsrc
        ip = ipaddress.ip_address(dest)
        own = [
            ipaddress.ip_interface(a)
            for a in self.addrs.get(route.oif, ())
            if ipaddress.ip_interface(a).version == ip.version
        ]
        own = [a for a in own if not a.ip.is_link_local] or own
        if not own:
            return None
        near = ipaddress.ip_address(route.gateway) if route.gateway else ip
        on_link = [a for a in own if near in a.network]
        return str(min(on_link or own, key=lambda a: int(a.ip)).ip)


class RouteFollower:
    """Moves the agent to the source address of its route to the broker.

    :meth:`feed` takes the events of one netlink read and returns the address to move to,
    or None. When the broker's address has no route in the view (a loopback broker on a
    development machine: the local table is not modelled), the follower falls back to
    the old rule: move only when the interface that held our address no longer does,
    to another address of that interface.
    """

    def __init__(self, host: str, dest: str | None) -> None:
        self.host = host
        self.dest = dest
        self.view = RoutingView()
        self._home: int | None = None  # the interface that last held host

    def set_host(self, host: str) -> None:
        """The agent moved by itself (``mdeci move``): follow from there."""
        self.host = host
        self._home = self.view.holder(host)

    def prime(self, events: Iterable[NetEvent]) -> None:
        """Apply ``events`` (the first dump) without deciding: :meth:`feed` decides."""
        for event in events:
            self.view.apply(event)
        self._home = self.view.holder(self.host)

    def feed(self, events: Iterable[NetEvent]) -> str | None:
        """Apply ``events``; the new address when the agent should move (then it is ours)."""
        for event in events:
            self.view.apply(event)
        new = self.decide()
        if new is not None:
            self.host = new
        holder = self.view.holder(self.host)
        if holder is not None:
            self._home = holder
        return new

    def decide(self) -> str | None:
        """The address to move to now, or None; changes nothing."""
        same_family = self.dest is not None and _version(self.dest) == _version(self.host)
        if self.dest is not None and same_family:
            source = self.view.source_for(self.dest)
            if source is not None:
                return None if source == self.host else source
        if self._home is None:
            return None
        return pick_new(self.host, self.view.addresses(self._home))
