"""Notices when the agent's data address should change, and names the new one.

On a device (:class:`RouteMonitor`, the default) the address follows the route to the
broker: the pure :class:`mdeci.agent.routes.RouteFollower` is fed link, address and
route events (``RTM_NEWLINK``, ``RTM_NEWADDR``/``RTM_DELADDR``,
``RTM_NEWROUTE``/``RTM_DELROUTE`` on every interface) and names the source address the
kernel would use to reach the broker; when that changes (the default route went from
Wi-Fi to cellular, Wi-Fi went down) the agent moves. This module is the thin netlink
I/O: :func:`translate` turns pyroute2 messages into events, a listener thread pushes
them (``netlink`` mode), and a full dump every ``poll_interval`` resynchronises (the
only input in ``poll`` mode).

With an injected *address source* (tests) or a configured ``interface``,
:class:`PollingIpMonitor` watches one interface's addresses only: the agent's address
is *held* while it equals one of them or lies inside the network of a loopback one
(:func:`mdeci.agent.routes.is_held`); when it is no longer held, the interface's lowest
other address of the same IP version is the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from mdeci.agent.routes import (
    AddrAdded,
    AddrRemoved,
    LinkChanged,
    LinkRemoved,
    NetEvent,
    Resync,
    Route,
    RouteAdded,
    RouteFollower,
    RouteRemoved,
    is_held,
    pick_new,
)
from mdeci.config import IpMonitorConfig, IpMonitorMode

__all__ = ["is_held", "pick_new"]  # re-exported: their home is mdeci.agent.routes

AddressSource = Callable[[], frozenset[str]]
OnChange = Callable[[str], Awaitable[None]]
Dump = Callable[[], list[NetEvent]]


class PollingIpMonitor:
    """Compares the source's addresses with ``host`` every ``interval`` seconds."""

    def __init__(self, source: AddressSource, host: str, interval: float) -> None:
        self.source = source
        self.host = host
        self.interval = interval
        self._wake = asyncio.Event()
        self._closed = False

    def check(self) -> str | None:
        """Read the source once; the new address if ours went away (then it is ours)."""
        new = pick_new(self.host, self.source())
        if new is not None:
            self.host = new
        return new

    def set_host(self, host: str) -> None:
        """The agent moved by itself (e.g. ``move_to``): watch the new address."""
        self.host = host

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop watching at the next wake-up (the task is cancelled by its owner)."""
        self._closed = True

    def wake(self) -> None:
        """Check now instead of at the end of the interval (netlink events call it)."""
        self._wake.set()

    async def run(self, on_change: OnChange) -> None:
        """Check forever; ``await on_change(new_host)`` on each change."""
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            new = self.check()
            if new is not None:
                await on_change(new)


class RouteMonitor:
    """Follows the source address of the route to the broker (:class:`RouteFollower`).

    Netlink events arrive with :meth:`push` (from the listener thread, through the
    loop) and are decided at once; every ``interval`` the whole state is dumped again
    (poll mode's only input, and netlink mode's guard against lost events).
    """

    def __init__(self, follower: RouteFollower, dump: Dump, interval: float) -> None:
        self.follower = follower
        self.dump = dump
        self.interval = interval
        self._pending: list[NetEvent] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._lost = False

    @property
    def host(self) -> str:
        return self.follower.host

    @property
    def closed(self) -> bool:
        return self._closed

    def lost(self) -> None:
        """Netlink lost events: dump the whole state again at once."""
        self._lost = True
        self._wake.set()

    def push(self, events: list[NetEvent]) -> None:
        """Events read from netlink, in order; decided at the next turn of :meth:`run`."""
        self._pending.extend(events)
        self._wake.set()

    def check(self, *, resync: bool = False) -> str | None:
        """Apply what was pushed (then a fresh dump if ``resync``); the new address or None."""
        events, self._pending = self._pending, []
        if resync or self._lost:
            self._lost = False
            events += self.dump()
        return self.follower.feed(events)

    def set_host(self, host: str) -> None:
        self.follower.set_host(host)

    def close(self) -> None:
        self._closed = True

    def wake(self) -> None:
        self._wake.set()

    async def run(self, on_change: OnChange) -> None:
        """Decide on each push, dump every ``interval``; ``await on_change(new_host)``."""
        resync = True  # at start: the route may already prefer another address
        while not self._closed:
            new = self.check(resync=resync)
            if new is not None:
                await on_change(new)
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
                resync = False
            except TimeoutError:
                resync = True
            self._wake.clear()


# ------------------------------------------------------------------ netlink (pyroute2)

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
NLM_F_REPLACE = 0x100
RT_TABLE_MAIN = 254
RTN_UNICAST = 1
# Links, IPv4/IPv6 addresses and routes (rtnetlink multicast groups).
RTMGRP_WATCHED = 0x1 | 0x10 | 0x40 | 0x100 | 0x400


def _address(msg: Any) -> str | None:
    # IFA_LOCAL is the local end of a point-to-point address; IFA_ADDRESS the peer there.
    addr = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
    return f"{addr}/{int(msg['prefixlen'])}" if addr else None


def _route(msg: Any) -> Route | None:
    table = msg.get_attr("RTA_TABLE") or msg["table"]
    oif = msg.get_attr("RTA_OIF")
    if int(table) != RT_TABLE_MAIN or int(msg["type"]) != RTN_UNICAST or oif is None:
        return None  # local/broadcast tables and multipath routes are not followed
    family_any = "::" if int(msg["family"]) == 10 else "0.0.0.0"
    dst = msg.get_attr("RTA_DST") or family_any
    return Route(
        dst=f"{dst}/{int(msg['dst_len'])}",
        oif=int(oif),
        gateway=msg.get_attr("RTA_GATEWAY"),
        prefsrc=msg.get_attr("RTA_PREFSRC"),
        metric=int(msg.get_attr("RTA_PRIORITY") or 0),
    )


def translate(msg: Any) -> NetEvent | None:
    """One pyroute2 rtnetlink message as a :data:`NetEvent` (None: not followed)."""
    kind = str(msg.get("event", ""))
    if kind == "RTM_NEWLINK":
        flags = int(msg["flags"])
        return LinkChanged(
            index=int(msg["index"]),
            name=str(msg.get_attr("IFLA_IFNAME") or ""),
            up=bool(flags & IFF_UP),
            carrier=bool(flags & IFF_LOWER_UP),
        )
    if kind == "RTM_DELLINK":
        return LinkRemoved(int(msg["index"]))
    if kind in ("RTM_NEWADDR", "RTM_DELADDR"):
        text = _address(msg)
        if text is None:
            return None
        kind_cls = AddrAdded if kind == "RTM_NEWADDR" else AddrRemoved
        return kind_cls(int(msg["index"]), text)
    if kind in ("RTM_NEWROUTE", "RTM_DELROUTE"):
        route = _route(msg)
        if route is None:
            return None
        if kind == "RTM_DELROUTE":
            return RouteRemoved(route)
        replace = bool(int(msg["header"].get("flags", 0)) & NLM_F_REPLACE)
        return RouteAdded(route, replace=replace)
    return None


def _translated(msgs: Any) -> list[NetEvent]:
    return [e for e in (translate(m) for m in msgs) if e is not None]


class _NetlinkWorker:
    """pyroute2 0.9's synchronous IPRoute runs its own event loop: it refuses to run
    inside ours, so every netlink call goes to one worker thread (a dump takes ms)."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mdeci-netlink")

    def run(self, fn: Callable[[Any], Any]) -> Any:
        from pyroute2 import IPRoute

        def call() -> Any:
            with IPRoute() as ipr:
                return fn(ipr)

        return self.pool.submit(call).result()


def netlink_dump(worker: _NetlinkWorker) -> Dump:
    """A :data:`Dump` of links, addresses and routes over netlink."""

    def read(ipr: Any) -> list[NetEvent]:
        events: list[NetEvent] = [Resync()]
        events += _translated(ipr.get_links())
        events += _translated(ipr.get_addr())
        events += _translated(ipr.get_routes())
        return events

    return lambda: list(worker.run(read))


def netlink_source(host: str, interface: str | None = None) -> AddressSource:
    """Addresses of ``interface`` (default: the one holding ``host`` now) via pyroute2.

    Raises :class:`ImportError` when pyroute2 is missing.
    """
    import pyroute2  # noqa: F401  (ImportError now rather than in the worker)

    worker = _NetlinkWorker()

    def dump() -> list[tuple[int, str]]:
        def read(ipr: Any) -> list[tuple[int, str]]:
            out = []
            for msg in ipr.get_addr():
                text = _address(msg)
                if text is not None:
                    out.append((int(msg["index"]), text))
            return out

        return list(worker.run(read))

    index: int | None = None
    if interface is not None:
        found = worker.run(lambda ipr: list(ipr.link_lookup(ifname=interface)))
        index = int(found[0]) if found else -1
    else:
        for idx, text in dump():
            if is_held(host, frozenset({text})):
                index = idx
                break

    def source() -> frozenset[str]:
        return frozenset(text for idx, text in dump() if index is None or idx == index)

    return source


Wakeable = PollingIpMonitor | RouteMonitor


def _netlink_events(monitor: Wakeable, loop: asyncio.AbstractEventLoop) -> Any:
    """Bind a pyroute2 socket to link, address and route events; a daemon thread hands
    them to the monitor through the loop (it cannot be interrupted in ``get``: it ends
    with the process, and stops posting once the monitor is closed)."""
    import threading

    from pyroute2 import IPRoute

    bound = threading.Event()

    def post(events: list[NetEvent]) -> None:
        if isinstance(monitor, RouteMonitor):
            monitor.push(events)
        else:
            monitor.wake()

    def lost() -> None:
        if isinstance(monitor, RouteMonitor):
            monitor.lost()
        else:
            monitor.wake()

    def listen() -> None:
        while not monitor.closed:
            try:
                ipr = IPRoute()
                ipr.bind(groups=RTMGRP_WATCHED)
            except Exception:  # no netlink here: the periodic dump is all there is
                bound.set()
                return
            bound.set()
            try:
                while not monitor.closed:
                    events = _translated(ipr.get())
                    if events and not monitor.closed:
                        loop.call_soon_threadsafe(post, events)
            except Exception:
                # Events were lost (ENOBUFS after a burst) or the socket broke: the view
                # is read again whole, and a new socket listens. The pause only keeps a
                # socket that fails at once from spinning.
                with contextlib.suppress(RuntimeError):  # the loop is closed: we are done
                    loop.call_soon_threadsafe(lost)
                time.sleep(0.1)
            finally:
                with contextlib.suppress(Exception):
                    ipr.close()

    thread = threading.Thread(target=listen, name="mdeci-netlink-events", daemon=True)
    thread.start()
    # Bound before the first dump, so no event falls between the two.
    bound.wait(5.0)
    return thread


def _resolved(dest: str | None) -> str | None:
    if dest is None:
        return None
    try:
        return str(ipaddress.ip_address(dest))
    except ValueError:
        return None  # a name: resolved by the caller, or only the address rule applies


def make_monitor(
    config: IpMonitorConfig,
    host: str,
    source: AddressSource | None = None,
    dest: str | None = None,
) -> Wakeable | None:
    """The monitor the config asks for, or None when ``host`` is a wildcard/unknown address.

    ``dest`` is the broker's (registrar's) IP address: the agent follows the source
    address of the route to it. With an injected ``source`` (tests: the addresses of
    one interface) or a configured ``interface`` it only follows that interface's
    addresses (:class:`PollingIpMonitor`). Without pyroute2 there is no monitor (None)
    and only ``move_to`` moves the agent.
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_unspecified:
        return None
    monitor: Wakeable
    try:
        if source is not None or config.interface is not None:
            if source is None:
                source = netlink_source(host, config.interface)
            monitor = PollingIpMonitor(source, host, config.poll_interval)
        else:
            dump = netlink_dump(_NetlinkWorker())
            follower = RouteFollower(host, _resolved(dest))
            follower.prime(dump())  # fails here, not in run(), when netlink does not work
            monitor = RouteMonitor(follower, dump, config.poll_interval)
    except (ImportError, OSError, RuntimeError):
        return None
    if config.mode is IpMonitorMode.NETLINK:
        with contextlib.suppress(ImportError, OSError):
            _netlink_events(monitor, asyncio.get_running_loop())
    return monitor


async def route_destination(host: str, like: str) -> str | None:
    """``host`` as an IP address of ``like``'s family (resolved if a name), or None: the
    IP monitor follows the route to it."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(like).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_UNSPEC
    try:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, None, family=family, type=socket.SOCK_DGRAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


_SIOCGIFADDR = 0x8915  # Linux: an interface's (primary) IPv4 address


def interface_of(address: str) -> str | None:
    """The name of the interface whose IPv4 address is ``address`` (the network kind of
    ``[network] interfaces``), None when none is (or not IPv4, or not Linux)."""
    import fcntl
    import socket
    import struct

    try:
        packed = socket.inet_aton(address)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                info = fcntl.ioctl(
                    sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue  # no IPv4 address
            if info[20:24] == packed:
                return name
    return None
