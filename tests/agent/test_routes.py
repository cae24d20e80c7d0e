"""Mobility that follows the device: the route decision on fake event streams.

No sockets: :class:`RouteFollower` is fed the events netlink would give for a phone with
``wifi`` (index 2, 10.1.0.2/24, gateway 10.1.0.1) and ``cell`` (index 3, 10.2.0.2/24,
gateway 10.2.0.1) reaching a broker at 192.0.2.10. A few tests read this machine's
netlink (no privilege needed) to check the translation of real pyroute2 messages.
"""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mdeci.agent.ipmonitor import RouteMonitor, _NetlinkWorker, netlink_dump, translate
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
    RoutingView,
    is_held,
)

BROKER = "192.0.2.10"
WIFI, CELL, LO = 2, 3, 1
WIFI_IP, CELL_IP = "10.1.0.2", "10.2.0.2"


def connected(index: int, net: str, src: str) -> Route:
    return Route(dst=net, oif=index, prefsrc=src)


def phone(default_via: int | None = WIFI) -> list[NetEvent]:
    """A dump: both links up, both addresses and connected routes, one default route."""
    gateway = {WIFI: "10.1.0.1", CELL: "10.2.0.1"}
    defaults = (
        [] if default_via is None else [Route("0.0.0.0/0", default_via, gateway[default_via])]
    )
    return [
        Resync(),
        LinkChanged(LO, "lo", up=True),
        LinkChanged(WIFI, "wifi", up=True),
        LinkChanged(CELL, "cell", up=True),
        AddrAdded(LO, "127.0.0.1/8"),
        AddrAdded(WIFI, f"{WIFI_IP}/24"),
        AddrAdded(CELL, f"{CELL_IP}/24"),
        RouteAdded(connected(WIFI, "10.1.0.0/24", WIFI_IP)),
        RouteAdded(connected(CELL, "10.2.0.0/24", CELL_IP)),
        *(RouteAdded(route) for route in defaults),
    ]


def follower(host: str = WIFI_IP, dest: str | None = BROKER) -> RouteFollower:
    f = RouteFollower(host, dest)
    f.prime(phone())
    return f


def test_default_route_moved_to_cell_then_wifi_down_is_one_move() -> None:
    f = follower()
    assert f.feed([]) is None  # settled on Wi-Fi
    # `ip route replace default via 10.2.0.1 dev cell`: one RTM_NEWROUTE with
    # NLM_F_REPLACE, no RTM_DELROUTE for the Wi-Fi route.
    replaced = RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1"), replace=True)
    assert f.feed([replaced]) == CELL_IP
    assert f.host == CELL_IP
    # `ip link set wifi down`: no route event at all for its IPv4 routes.
    assert f.feed([LinkChanged(WIFI, "wifi", up=False, carrier=False)]) is None
    assert f.host == CELL_IP
    assert all(r.oif != WIFI for r in f.view.routes)


def test_a_replace_without_the_flag_keeps_both_and_the_first_wins() -> None:
    # `ip route append` (no NLM_F_REPLACE) of an equal route leaves the first one used,
    # as in the kernel: the flag is what makes the replace a move.
    f = follower()
    appended = RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1", metric=0))
    assert f.feed([appended]) is None and f.host == WIFI_IP
    assert len([r for r in f.view.routes if r.dst == "0.0.0.0/0"]) == 2
    f2 = follower()
    replaced = RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1"), replace=True)
    assert f2.feed([replaced]) == CELL_IP


def test_wifi_going_down_falls_back_to_the_cell_default_of_higher_metric() -> None:
    f = RouteFollower(WIFI_IP, BROKER)
    f.prime(
        [
            *phone(default_via=None),
            RouteAdded(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1", metric=100)),
            RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1", metric=700)),
        ]
    )
    assert f.feed([]) is None  # Wi-Fi's default has the lower metric
    assert f.feed([LinkChanged(WIFI, "wifi", up=False, carrier=False)]) == CELL_IP
    # Wi-Fi up again: its routes were flushed by the kernel, so nothing moves until
    # they come back (NetworkManager re-adds them).
    assert f.feed([LinkChanged(WIFI, "wifi", up=True)]) is None
    back = RouteAdded(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1", metric=100))
    assert f.feed([back]) == WIFI_IP


def test_carrier_loss_keeps_the_routes_but_does_not_use_them() -> None:
    f = RouteFollower(WIFI_IP, BROKER)
    f.prime(
        [
            *phone(default_via=None),
            RouteAdded(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1", metric=100)),
            RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1", metric=700)),
        ]
    )
    assert f.feed([LinkChanged(WIFI, "wifi", up=True, carrier=False)]) == CELL_IP
    assert f.feed([LinkChanged(WIFI, "wifi", up=True, carrier=True)]) == WIFI_IP


def test_the_address_going_away_drops_its_connected_and_prefsrc_routes() -> None:
    f = RouteFollower(WIFI_IP, BROKER)
    f.prime(
        [
            *phone(default_via=None),
            RouteAdded(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1", prefsrc=WIFI_IP, metric=100)),
            RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1", metric=700)),
        ]
    )
    assert f.feed([AddrRemoved(WIFI, f"{WIFI_IP}/24")]) == CELL_IP
    assert [r for r in f.view.routes if r.oif == WIFI] == []


def test_a_more_specific_route_beats_the_default() -> None:
    f = follower()
    specific = RouteAdded(Route("192.0.2.0/24", CELL, gateway="10.2.0.1"))
    assert f.feed([specific]) == CELL_IP
    assert f.feed([RouteRemoved(Route("192.0.2.0/24", CELL, gateway="10.2.0.1"))]) == WIFI_IP


def test_route_removed_only_for_its_next_hop() -> None:
    view = RoutingView()
    for event in phone():
        view.apply(event)
    view.apply(RouteRemoved(Route("0.0.0.0/0", CELL, gateway="10.2.0.1")))
    assert view.route_to(BROKER) == Route("0.0.0.0/0", WIFI, gateway="10.1.0.1")
    view.apply(RouteRemoved(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1")))
    assert view.route_to(BROKER) is None and view.source_for(BROKER) is None


def test_prefsrc_is_the_source_only_while_an_interface_holds_it() -> None:
    view = RoutingView()
    for event in phone():
        view.apply(event)
    view.apply(AddrAdded(WIFI, "10.1.0.9/24"))
    view.apply(
        RouteAdded(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1", prefsrc="10.1.0.9"), replace=True)
    )
    assert view.source_for(BROKER) == "10.1.0.9"
    view.apply(RouteAdded(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1", prefsrc="10.9.9.9"), True))
    # Not ours: the interface's address on the gateway's network.
    assert view.source_for(BROKER) == WIFI_IP


def test_no_route_to_the_broker_keeps_the_address() -> None:
    f = follower()
    assert f.feed([RouteRemoved(Route("0.0.0.0/0", WIFI, gateway="10.1.0.1"))]) is None
    assert f.host == WIFI_IP


def test_a_broker_on_a_local_address_uses_the_old_interface_rule() -> None:
    # On a development machine the broker is on lo (local table, not modelled): a
    # default route must not take the agent away from 127.0.0.2.
    f = RouteFollower("127.0.0.2", "127.0.0.1")
    f.prime(phone())
    assert f.feed([]) is None
    f2 = RouteFollower(WIFI_IP, WIFI_IP)
    f2.prime([*phone(), AddrAdded(WIFI, "10.1.0.7/24")])
    assert f2.feed([AddrRemoved(WIFI, f"{WIFI_IP}/24")]) == "10.1.0.7"


def test_without_a_broker_address_only_the_interface_rule_applies() -> None:
    f = follower(dest=None)
    replaced = RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1"), replace=True)
    assert f.feed([replaced]) is None
    assert f.feed([AddrAdded(WIFI, "10.1.0.5/24"), AddrRemoved(WIFI, f"{WIFI_IP}/24")]) == (
        "10.1.0.5"
    )


def test_a_broker_of_the_other_ip_version_is_not_followed() -> None:
    f = RouteFollower(WIFI_IP, "2001:db8:ff::10")
    f.prime(phone())
    replaced = RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1"), replace=True)
    assert f.feed([replaced]) is None


def test_a_manual_move_is_undone_by_the_route_at_the_next_event() -> None:
    # `mdeci move` on a device whose route prefers another address: the data address
    # follows the route, so the next netlink event moves it back.
    f = follower()
    f.set_host(CELL_IP)
    assert f.feed([]) == WIFI_IP


def test_link_removed_and_resync_forget() -> None:
    f = follower()
    assert f.feed([LinkRemoved(WIFI)]) is None  # no route left: stay
    assert f.view.addresses(WIFI) == frozenset()
    assert f.feed(phone(default_via=CELL)) == CELL_IP
    assert f.feed([Resync()]) is None and f.view.routes == []


def test_ipv6_default_route() -> None:
    f = RouteFollower("2001:db8:1::2", "2001:db8:ff::10")
    f.prime(
        [
            LinkChanged(WIFI, "wifi", up=True),
            LinkChanged(CELL, "cell", up=True),
            AddrAdded(WIFI, "2001:db8:1::2/64"),
            AddrAdded(WIFI, "fe80::2/64"),
            AddrAdded(CELL, "fe80::3/64"),
            AddrAdded(CELL, "2001:db8:2::2/64"),
            RouteAdded(Route("::/0", WIFI, gateway="fe80::1", metric=100)),
            RouteAdded(Route("::/0", CELL, gateway="fe80::1", metric=200)),
        ]
    )
    assert f.feed([]) is None
    # The link-local gateway is on both links; the global address is the source.
    assert f.feed([RouteRemoved(Route("::/0", WIFI, gateway="fe80::1", metric=100))]) == (
        "2001:db8:2::2"
    )


_ifaces = st.sampled_from([LO, WIFI, CELL])
_addrs = st.sampled_from(
    ["10.1.0.2/24", "10.1.0.7/24", "10.2.0.2/24", "127.0.0.1/8", "2001:db8::2/64"]
)
_routes = st.builds(
    Route,
    dst=st.sampled_from(["0.0.0.0/0", "192.0.2.0/24", "10.1.0.0/24", "::/0"]),
    oif=_ifaces,
    gateway=st.sampled_from([None, "10.1.0.1", "10.2.0.1"]),
    prefsrc=st.sampled_from([None, "10.1.0.2", "10.9.9.9"]),
    metric=st.sampled_from([0, 100]),
)
_events = st.one_of(
    st.builds(LinkChanged, _ifaces, st.just("x"), st.booleans(), st.booleans()),
    st.builds(LinkRemoved, _ifaces),
    st.builds(AddrAdded, _ifaces, _addrs),
    st.builds(AddrRemoved, _ifaces, _addrs),
    st.builds(RouteAdded, _routes, st.booleans()),
    st.builds(RouteRemoved, _routes),
    st.just(Resync()),
)


@given(st.lists(_events, max_size=30))
def test_any_event_stream_names_only_an_address_we_hold(events: list[NetEvent]) -> None:
    f = RouteFollower(WIFI_IP, BROKER)
    f.prime(phone())
    for event in events:
        new = f.feed([event])
        if new is not None:
            assert is_held(new, f.view.addresses())
            assert ipaddress.ip_address(new).version == 4
    assert f.decide() is None  # level-triggered: after a move, settled


# ------------------------------------------------------------------ the thin I/O


def test_a_dump_of_this_machine_translates() -> None:
    pytest.importorskip("pyroute2", reason="pyroute2 is a dependency: pip install -e .")
    events = netlink_dump(_NetlinkWorker())()
    assert events[0] == Resync()
    links = [e for e in events if isinstance(e, LinkChanged)]
    assert any(e.name == "lo" and e.up for e in links)
    assert any(isinstance(e, AddrAdded) and e.address == "127.0.0.1/8" for e in events)
    # Local-table routes (127.0.0.0/8 on lo) are not followed.
    assert not any(isinstance(e, RouteAdded) and e.route.dst == "127.0.0.0/8" for e in events)


def test_translate_reads_replace_and_ignores_other_tables() -> None:
    rtmsg = pytest.importorskip("pyroute2.netlink.rtnl.rtmsg").rtmsg
    msg = rtmsg()
    msg["family"], msg["dst_len"], msg["table"], msg["type"] = 2, 0, 254, 1
    msg["attrs"] = [("RTA_OIF", 3), ("RTA_GATEWAY", "10.2.0.1"), ("RTA_PRIORITY", 5)]
    msg["header"]["flags"] = 0x100
    msg["event"] = "RTM_NEWROUTE"
    assert translate(msg) == RouteAdded(Route("0.0.0.0/0", 3, "10.2.0.1", None, 5), replace=True)
    msg["event"] = "RTM_DELROUTE"
    assert translate(msg) == RouteRemoved(Route("0.0.0.0/0", 3, "10.2.0.1", None, 5))
    msg["table"] = 255
    assert translate(msg) is None


async def test_route_monitor_moves_on_a_push_without_waiting_for_the_interval() -> None:
    dumped = asyncio.Event()

    def dump() -> list[NetEvent]:
        dumped.set()
        return phone()

    # The interval is an hour: only the push can make the move.
    monitor = RouteMonitor(RouteFollower(WIFI_IP, BROKER), dump, 3600.0)
    moved: asyncio.Queue[str] = asyncio.Queue()

    async def on_change(host: str) -> None:
        await moved.put(host)

    task = asyncio.create_task(monitor.run(on_change))
    try:
        await asyncio.wait_for(dumped.wait(), 5.0)  # the first dump, at start
        assert moved.empty()
        monitor.push([RouteAdded(Route("0.0.0.0/0", CELL, gateway="10.2.0.1"), replace=True)])
        assert await asyncio.wait_for(moved.get(), 5.0) == CELL_IP
        assert monitor.host == CELL_IP
    finally:
        monitor.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_route_monitor_dumps_again_when_netlink_lost_events() -> None:
    dumps = [phone(), phone(default_via=CELL)]
    monitor = RouteMonitor(RouteFollower(WIFI_IP, BROKER), lambda: dumps.pop(0), 3600.0)
    assert monitor.check(resync=True) is None
    # The route change itself was among the lost events: only the new dump shows it.
    assert monitor.check() is None
    monitor.lost()
    assert monitor.check() == CELL_IP and dumps == []
