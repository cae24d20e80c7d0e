"""The seven mobility models of the seed papers, and the world they move in.

A *world* is the access networks (subnets of several kinds), a topology (which networks
neighbour which) and a list of subnet outages, all drawn from the seed. A model turns a
user's own ``random.Random`` into a *timeline*: online stints ``(start, end, subnet)``
in milliseconds since the log's start; the time between two stints is a disconnection,
two touching stints are a seamless move.

Two papers define the models. JECho's four (random, travelling salesman, pop-up, fixed)
say where a device goes next and after how long; a move is a handover, the device stays
connected. Walkabout's three (commute, pervasive, random) say when a device is connected
and for how long it is not. Each model's docstring gives its definition in our words and
its source; :class:`MobilityParams` holds the figures, the papers' where they give one.

The sources are the two papers the project's churn analytics follow (docs/analytics.md,
"Mobility models", names them and says what of them could be checked): JECho's
mobility-aware event channels for the first four and the mobility-to-communication
ratio, the Walkabout evaluation for the last three.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR

# A stint: online on one subnet from start to end (ms since the log's start).
Stint = tuple[int, int, int]


@dataclass(frozen=True, kw_only=True, slots=True)
class MobilityParams:
    """The models' figures. Each default says where it comes from."""

    dwell_mean_min: float = 90.0
    """JECho models: mean of the exponential time spent at a node before the next move
    (ours: the papers give the shape, exponential, not a mean we could verify)."""
    remote_share: float = 0.2
    """JECho pop-up: share of moves that jump to a randomly chosen remote (non-neighbour)
    node instead of a neighbour (ours; the paper says "sometimes")."""
    favourite_share: float = 0.8
    """JECho fixed: share of the stays, hence of the time, spent at the two favourite
    locations (ours; the paper says "more often than others")."""
    period_min: tuple[float, float] = (10.0, 30.0)
    """Walkabout random: each connected and each disconnected period is uniform on this
    range, in minutes (the paper's 10 to 30)."""
    office_arrival_h: tuple[float, float] = (8.0, 9.0)
    """Walkabout commute: connects at the office at a uniform instant in this range of
    hours (the paper's 8 to 9)."""
    office_stay_h: float = 8.0
    """Walkabout commute: about this long at the office (the paper's ~8 h; ours: +-30 min
    uniform around it)."""
    ride_min: tuple[float, float] = (30.0, 90.0)
    """Walkabout commute: the extended disconnection between office and home, uniform on
    this range in minutes (ours; the paper says "an extended period")."""
    proxy_dwell_min: float = 10.0
    """Walkabout pervasive: the regular time at one proxy before moving on (ours), +-10 %."""
    proxy_gap_s: tuple[float, float] = (5.0, 30.0)
    """Walkabout pervasive: each move's short disconnection, uniform in seconds (ours)."""
    night_off_share: float = 0.0
    """Walkabout commute: share of nights the device is switched off at home (not in the
    paper, whose value is therefore 0; logs that need session ends set it)."""


@dataclass(frozen=True, slots=True)
class Subnet:
    """A /24 the users can attach to; ``kind`` is home, office, cafe, campus or cellular."""

    kind: str
    prefix: str  # "10.1.7", the first three octets

    @property
    def cidr(self) -> str:
        return f"{self.prefix}.0/24"


@dataclass(frozen=True, slots=True)
class Outage:
    """Every user on ``subnet`` loses connectivity at ``at_ms`` for about ``duration_ms``."""

    subnet: int
    at_ms: int
    duration_ms: int


@dataclass(slots=True)
class World:
    """The subnets, their topology and the outages shared by all users of one run."""

    subnets: list[Subnet]
    by_kind: dict[str, list[int]]
    neighbours: list[tuple[int, ...]] = field(default_factory=list)
    """For each subnet, the subnets a JECho walk may move to next (symmetric)."""
    outages: list[Outage] = field(default_factory=list)

    def subnet_of_prefix(self) -> dict[str, int]:
        """``"10.1.7"`` -> its subnet's index: how a reader maps a logged address back."""
        return {s.prefix: i for i, s in enumerate(self.subnets)}


KINDS: tuple[tuple[str, str, int], ...] = (
    # kind, first two octets, how many /24s
    ("home", "10.1", 14),
    ("office", "10.20", 6),
    ("cafe", "10.30", 8),
    ("campus", "10.40", 16),
    ("cellular", "100.64", 4),
)


def build_topology(count: int, rng: random.Random, chords: int) -> list[tuple[int, ...]]:
    """A connected, symmetric neighbour relation on ``count`` nodes: a ring (every node
    reaches every other) plus ``chords`` random shortcuts, as a city's access networks
    overlap with the ones next to them and a few far ones."""
    links: list[set[int]] = [set() for _ in range(count)]
    order = list(range(count))
    rng.shuffle(order)
    for a, b in zip(order, order[1:] + order[:1], strict=True):
        links[a].add(b)
        links[b].add(a)
    for _ in range(chords):
        a, b = rng.sample(range(count), 2)
        links[a].add(b)
        links[b].add(a)
    return [tuple(sorted(n)) for n in links]


# ----------------------------------------------------------------------- JECho models


def _walk(
    rng: random.Random, days: int, mean_ms: float, start: int, step: Callable[[int], int]
) -> list[Stint]:
    """Stays of exponential length (mean ``mean_ms``) back to back; ``step`` picks the
    node after a given one."""
    out: list[Stint] = []
    node = start
    t = 0
    span = days * DAY
    while t < span:
        dwell = max(1, int(rng.expovariate(1 / mean_ms)))
        out.append((t, t + dwell, node))
        t += dwell
        node = step(node)
    return out


def jecho_random(rng: random.Random, world: World, days: int, p: MobilityParams) -> list[Stint]:
    """JECho's random model: the device stays at a node for an exponentially distributed
    time, then moves to a node chosen uniformly at random among all the others."""
    n = len(world.subnets)

    def step(node: int) -> int:
        other = rng.randrange(n - 1)
        return other + 1 if other >= node else other

    return _walk(rng, days, p.dwell_mean_min * MINUTE, rng.randrange(n), step)


def jecho_salesman(rng: random.Random, world: World, days: int, p: MobilityParams) -> list[Stint]:
    """JECho's travelling-salesman model: after an exponentially distributed stay the
    device moves to a randomly chosen *neighbour* of its current node (the topology of
    :attr:`World.neighbours`)."""

    def step(node: int) -> int:
        return rng.choice(world.neighbours[node])

    return _walk(rng, days, p.dwell_mean_min * MINUTE, rng.randrange(len(world.subnets)), step)


def jecho_popup(rng: random.Random, world: World, days: int, p: MobilityParams) -> list[Stint]:
    """JECho's pop-up model: the salesman's walk, except that a share of the moves
    (``remote_share``) jumps to a randomly chosen remote node, one that is not a
    neighbour of the current node."""
    n = len(world.subnets)

    def step(node: int) -> int:
        near = world.neighbours[node]
        if rng.random() < p.remote_share:
            far = [x for x in range(n) if x != node and x not in near]
            if far:
                return rng.choice(far)
        return rng.choice(near)

    return _walk(rng, days, p.dwell_mean_min * MINUTE, rng.randrange(n), step)


def jecho_fixed(rng: random.Random, world: World, days: int, p: MobilityParams) -> list[Stint]:
    """JECho's fixed model: two favourite locations (say home and office) are visited
    more often than the others, with occasional roaming. Each stay is at a favourite
    with probability ``favourite_share`` (the other favourite when already at one), else
    at another node chosen at random; stays are exponential, so the favourites take that
    share of the time."""
    n = len(world.subnets)
    favourites = rng.sample(range(n), 2)
    others = [x for x in range(n) if x not in favourites]

    def step(node: int) -> int:
        if rng.random() < p.favourite_share:
            if node in favourites:
                return favourites[1 - favourites.index(node)]
            return rng.choice(favourites)
        choices = [x for x in others if x != node]
        return rng.choice(choices)

    return _walk(rng, days, p.dwell_mean_min * MINUTE, favourites[0], step)


# ------------------------------------------------------------------- Walkabout models


def walkabout_commute(
    rng: random.Random, world: World, days: int, p: MobilityParams, weekday0: int = 0
) -> list[Stint]:
    """Walkabout's commute pattern: on a working day the device connects at the office
    at a uniform instant between 8 and 9, stays about 8 hours, disconnects for an
    extended period (the ride home, no network at all), then connects at home, where it
    stays until it leaves for the office the next morning (the ride there is a
    disconnection too). Weekends are spent at home."""
    home = rng.choice(world.by_kind["home"])
    office = rng.choice(world.by_kind["office"])
    lo, hi = p.ride_min
    out: list[Stint] = []
    t = 0  # when the device is next online at home
    for d in range(days):
        day0 = d * DAY
        if (weekday0 + d) % 7 < 5:
            arrive = day0 + int(rng.uniform(*p.office_arrival_h) * HOUR)
            leave_home = arrive - int(rng.uniform(lo, hi) * MINUTE)
            if leave_home > t:
                out.append((t, leave_home, home))
            arrive = max(arrive, t + MINUTE)
            leave = arrive + int((p.office_stay_h + rng.uniform(-0.5, 0.5)) * HOUR)
            out.append((arrive, leave, office))
            t = leave + int(rng.uniform(lo, hi) * MINUTE)
        if rng.random() < p.night_off_share:
            # Switched off for the night: a graceful gap, not a disconnection.
            bed = max(t + MINUTE, day0 + int(rng.uniform(21.0, 23.5) * HOUR))
            out.append((t, bed, home))
            t = day0 + DAY + int(rng.uniform(5.5, 7.5) * HOUR)
    out.append((t, max(t + MINUTE, days * DAY), home))
    return out


def walkabout_pervasive(
    rng: random.Random, world: World, days: int, p: MobilityParams
) -> list[Stint]:
    """Walkabout's pervasive pattern: the device moves regularly between proxies (the
    campus's access points), every ``proxy_dwell_min`` minutes give or take 10 %, and
    each move is a short disconnection (``proxy_gap_s``): short but frequent breaks."""
    proxies = world.by_kind["campus"]
    out: list[Stint] = []
    node = rng.choice(proxies)
    t = 0
    span = days * DAY
    while t < span:
        dwell = int(p.proxy_dwell_min * rng.uniform(0.9, 1.1) * MINUTE)
        out.append((t, t + dwell, node))
        t += dwell + int(rng.uniform(*p.proxy_gap_s) * 1000)
        node = rng.choice([x for x in proxies if x != node])
    return out


def walkabout_random(rng: random.Random, world: World, days: int, p: MobilityParams) -> list[Stint]:
    """Walkabout's random pattern: the device alternates connected and disconnected
    periods, each of a length uniform between 10 and 30 minutes (``period_min``),
    reconnecting each time to a network chosen at random."""
    n = len(world.subnets)
    out: list[Stint] = []
    t = 0
    span = days * DAY
    node = rng.randrange(n)
    while t < span:
        up = int(rng.uniform(*p.period_min) * MINUTE)
        out.append((t, t + up, node))
        t += up + int(rng.uniform(*p.period_min) * MINUTE)
        node = rng.randrange(n)
    return out


def moves_per_hour(model: str, p: MobilityParams) -> float:
    """The mean number of moves (address changes) per hour a model makes: the
    mobility side of JECho's mobility-to-communication ratio."""
    if model.startswith("jecho-"):
        return 60.0 / p.dwell_mean_min
    if model == "walkabout-random":
        return 60.0 / (p.period_min[0] + p.period_min[1])
    if model == "walkabout-pervasive":
        return 60.0 / (p.proxy_dwell_min + sum(p.proxy_gap_s) / 120.0)
    return 2.0 * 5 / 7 / 24  # commute: home -> office -> home on working days


Model = Callable[[random.Random, World, int, MobilityParams], list[Stint]]

MODEL_FUNCS: dict[str, Model] = {
    "jecho-random": jecho_random,
    "jecho-salesman": jecho_salesman,
    "jecho-popup": jecho_popup,
    "jecho-fixed": jecho_fixed,
    "walkabout-commute": walkabout_commute,
    "walkabout-pervasive": walkabout_pervasive,
    "walkabout-random": walkabout_random,
}
