"""A device behind a real NAT: two network namespaces and an nftables masquerade.

::

    device ns            router ns (nftables masquerade)          root ns
    uplink: D.2/24 ---- rin: D.1/24   rout: P.2/24 ------------- host: P.1/24 (broker)

The device's default route is the router; the router masquerades what leaves ``rout``
to UDP source ports in :attr:`NatLab.ports`, so the broker sees the router's address and
a port the router chose, never the device's own. :meth:`rebind` moves the masquerade to
another port range and deletes the router's conntrack entries: the device's next packet
leaves from a new port, as when a mobile carrier's NAT rebinds. UDP mappings idle for
:attr:`NatLab.udp_timeout` seconds expire (the router namespace's own conntrack timeouts),
so only traffic (keepalives) holds one.

:meth:`close` deletes the nftables table, both namespaces and the root-side veth,
whatever state a test left them in.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from dataclasses import dataclass

from tests.peers import require_binary, require_netns

GUARD = 30  # seconds for one ip/nft/conntrack/sysctl command
TABLE = "mdeci_nat"
FIRST_PORTS = (20000, 24999)
REBOUND_PORTS = (40000, 44999)
_ENTRY = re.compile(r"src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)")


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=GUARD, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Mapping:
    """One UDP conntrack entry of the router: the device's address and port, and the
    router's public port the broker sees; ``id`` tells a re-created entry from a kept one."""

    device_port: int
    public_port: int
    peer_port: int
    id: str


class NatLab:
    def __init__(self, udp_timeout: int) -> None:
        require_netns()
        self.nft = require_binary("nft", "apt-get install -y nftables")
        self.conntrack = require_binary("conntrack", "apt-get install -y conntrack")
        tag = os.getpid() % 10000
        n = 20 + os.getpid() % 200
        self.device_ns, self.router_ns = f"mdeci-natd-{tag}", f"mdeci-natr-{tag}"
        self.host_if = f"mdn{tag}h"
        self.device_ip, self.router_inner = f"10.83.{n}.2", f"10.83.{n}.1"
        self.router_outer, self.broker_ip = f"10.84.{n}.2", f"10.84.{n}.1"
        self.udp_timeout = udp_timeout
        self.ports = FIRST_PORTS
        self._created = False

    def _ip(self, *args: str) -> None:
        _run("ip", *args)

    def _in(self, ns: str, *args: str) -> str:
        return _run("ip", "netns", "exec", ns, *args)

    def open(self) -> NatLab:
        self._created = True
        self._ip("netns", "add", self.device_ns)
        self._ip("netns", "add", self.router_ns)
        self._ip(
            "-n", self.device_ns, "link", "add", "uplink", "type", "veth", "peer", "name", "rin"
        )
        self._ip("-n", self.device_ns, "link", "set", "rin", "netns", self.router_ns)
        self._ip("link", "add", self.host_if, "type", "veth", "peer", "name", "rout")
        self._ip("link", "set", "rout", "netns", self.router_ns)
        self._ip("addr", "add", f"{self.broker_ip}/24", "dev", self.host_if)
        self._ip("link", "set", self.host_if, "up")
        for ns, ifname, addr in (
            (self.device_ns, "uplink", self.device_ip),
            (self.router_ns, "rin", self.router_inner),
            (self.router_ns, "rout", self.router_outer),
        ):
            self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", ifname)
            self._ip("-n", ns, "link", "set", ifname, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")
        self._ip("-n", self.device_ns, "route", "add", "default", "via", self.router_inner)
        self._in(self.router_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._masquerade(FIRST_PORTS)
        # The namespace's conntrack timeouts exist once the masquerade loaded conntrack.
        for key in ("nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"):
            self._in(self.router_ns, "sysctl", "-qw", f"net.netfilter.{key}={self.udp_timeout}")
        return self

    def _masquerade(self, ports: tuple[int, int]) -> None:
        """The router's only NAT rule set: UDP to ``ports``, anything else masqueraded."""
        script = (
            f"table ip {TABLE} {{\n"
            "  chain post {\n"
            "    type nat hook postrouting priority srcnat; policy accept;\n"
            f'    oifname "rout" meta l4proto udp masquerade to :{ports[0]}-{ports[1]}\n'
            '    oifname "rout" masquerade\n'
            "  }\n"
            "}\n"
        )
        with contextlib.suppress(RuntimeError):
            self._in(self.router_ns, self.nft, "delete", "table", "ip", TABLE)
        done = subprocess.run(
            ["ip", "netns", "exec", self.router_ns, self.nft, "-f", "-"],
            input=script, capture_output=True, text=True, timeout=GUARD, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"nft -f: {done.stderr.strip()}")
        self.ports = ports

    def mappings(self) -> list[Mapping]:
        """The router's UDP conntrack entries from the device to the broker."""
        out = self._in(self.router_ns, self.conntrack, "-L", "-p", "udp", "-o", "id")
        found = []
        for line in out.splitlines():
            tuples = _ENTRY.findall(line)
            ident = re.search(r"id=(\d+)", line)
            if len(tuples) < 2 or ident is None:
                continue
            (src, _dst, sport, dport), (_rsrc, rdst, _rsport, rdport) = tuples[:2]
            if src == self.device_ip and rdst == self.router_outer:
                found.append(Mapping(int(sport), int(rdport), int(dport), ident.group(1)))
        return found

    def rebind(self) -> None:
        """Masquerade to :data:`REBOUND_PORTS` and forget every mapping."""
        self._masquerade(REBOUND_PORTS)
        # conntrack -D exits 1 when there was nothing to delete.
        subprocess.run(
            ["ip", "netns", "exec", self.router_ns, self.conntrack, "-D", "-p", "udp"],
            capture_output=True, timeout=GUARD, check=False,
        )  # fmt: skip

    def close(self) -> None:
        if not self._created:
            return
        with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
            self._in(self.router_ns, self.nft, "delete", "table", "ip", TABLE)
        for args in (
            ("netns", "del", self.device_ns),
            ("netns", "del", self.router_ns),
            ("link", "del", self.host_if),  # normally gone with the router namespace
        ):
            with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
                self._ip(*args)
