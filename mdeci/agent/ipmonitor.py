"""Notices when the address the agent is bound to goes away, and names the new one.

An *address source* returns the interface addresses with their prefix (``"10.0.0.5/24"``)
of the watched interface (or of every interface). The agent's address is *held* while it
equals one of them or lies inside the network of a loopback one (``127.0.0.2`` is held
by ``127.0.0.1/8`` on ``lo``: the kernel makes the whole prefix local there, and only
there; ``10.0.0.2`` is not held by ``10.0.0.3/24``). When it is no longer held and
another address of the same IP version is there, that one is the new address (the
lowest, for a stable choice).

:class:`PollingIpMonitor` reads the source every ``poll_interval``; the source is
injected, so tests drive it with a list and call :meth:`PollingIpMonitor.check`.
:func:`netlink_source` reads addresses over netlink with pyroute2; :func:`make_monitor`
picks it in both modes (``netlink`` mode also wakes on pyroute2's address events when a
netlink socket can be bound, and polls as a fallback).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from mdeci.config import IpMonitorConfig, IpMonitorMode

AddressSource = Callable[[], frozenset[str]]
OnChange = Callable[[str], Awaitable[None]]


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


def netlink_source(host: str, interface: str | None = None) -> AddressSource:
    """Addresses of ``interface`` (default: the one holding ``host`` now) via pyroute2.

    Raises :class:`ImportError` when pyroute2 is missing.
    """
    from concurrent.futures import ThreadPoolExecutor

    from pyroute2 import IPRoute

    # pyroute2 0.9's synchronous IPRoute runs its own event loop: it refuses to run inside
    # ours, so every netlink call goes to one worker thread (a dump takes milliseconds).
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mdeci-netlink")

    def in_thread(fn: Callable[[], Any]) -> Any:
        return worker.submit(fn).result()

    def dump() -> list[tuple[int, str]]:
        return list(in_thread(_dump))

    def _dump() -> list[tuple[int, str]]:
        with IPRoute() as ipr:
            out: list[tuple[int, str]] = []
            for msg in ipr.get_addr():
                addr = msg.get_attr("IFA_ADDRESS")
                if addr:
                    out.append((int(msg["index"]), f"{addr}/{int(msg['prefixlen'])}"))
            return out

    index: int | None = None
    if interface is not None:

        def lookup() -> list[int]:
            with IPRoute() as ipr:
                return list(ipr.link_lookup(ifname=interface))

        found = in_thread(lookup)
        index = int(found[0]) if found else -1
    else:
        for idx, text in dump():
            if is_held(host, frozenset({text})):
                index = idx
                break

    def source() -> frozenset[str]:
        return frozenset(text for idx, text in dump() if index is None or idx == index)

    return source


def _netlink_events(monitor: PollingIpMonitor, loop: asyncio.AbstractEventLoop) -> Any:
    """Bind a pyroute2 socket to address events; a daemon thread wakes the monitor."""
    import threading

    from pyroute2 import IPRoute

    def listen() -> None:
        with contextlib.suppress(Exception):
            ipr = IPRoute()
            ipr.bind()
            while True:
                for msg in ipr.get():
                    if str(msg.get("event", "")).endswith("ADDR"):
                        loop.call_soon_threadsafe(monitor.wake)

    thread = threading.Thread(target=listen, name="mdeci-netlink-events", daemon=True)
    thread.start()
    return thread


def make_monitor(
    config: IpMonitorConfig, host: str, source: AddressSource | None = None
) -> PollingIpMonitor | None:
    """The monitor the config asks for, or None when ``host`` is a wildcard/unknown address.

    With no ``source`` it reads netlink through pyroute2; without pyroute2 there is no
    monitor (None) and only ``move_to`` moves the agent.
    """
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.is_unspecified:
        return None
    if source is None:
        try:
            source = netlink_source(host, config.interface)
        except (ImportError, OSError, RuntimeError):
            return None
    monitor = PollingIpMonitor(source, host, config.poll_interval)
    if config.mode is IpMonitorMode.NETLINK:
        with contextlib.suppress(ImportError, OSError):
            _netlink_events(monitor, asyncio.get_running_loop())
    return monitor
