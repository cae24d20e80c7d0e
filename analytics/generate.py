"""Synthetic churn logs: users moving between subnets under the seed papers' mobility models.

Theory of operation. A *world* (subnets of several kinds and a list of subnet outages) is
drawn from the seed. Each user then gets a *timeline*: online stints ``(start, end,
subnet)`` separated by gaps, drawn by the chosen model with the user's own
``random.Random`` (seeded from the run seed and the user's index, so a user's log does
not depend on how many other users there are or how the run is sharded). Outages of the
world cut every stint that is on the failed subnet at that moment, which is what makes
reconnect storms. Finally the timeline is played: registrations, sessions, handovers,
disconnections and restores at the stint edges, and a Poisson stream of notifications
that are delivered while the user is connected and queued, dropped or sent by SMS while
not.

Models (the ``--model`` option):

- ``random``: Walkabout's random connection pattern and JECho's random movement: dwell
  times are exponential and the next subnet is any subnet; half the moves go through a
  gap.
- ``commute``: Walkabout's commute pattern: home, cellular on the way with tunnels,
  office (lunch at a cafe now and then), cellular back, home; phones off some nights.
- ``pervasive``: Walkabout's pervasive pattern: always on, hopping between the access
  points of a campus every few minutes, mostly seamless.
- ``popup``: JECho's pop-up movement: offline most of the time, popping up at hot-spots
  for minutes at a time.
- ``salesman``: JECho's travelling-salesman movement: a fixed tour of client sites each
  weekday, on cellular between them.

Lines are JSON objects formatted by hand (the generator's strings need no escaping, and
``json.dumps`` would be most of the run time). A small, seeded share of lines is
duplicated, swapped with its neighbour or truncated, as real shipped logs are.
"""

from __future__ import annotations

import heapq
import io
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from analytics.errors import OptionError

MODELS: tuple[str, ...] = ("random", "commute", "pervasive", "popup", "salesman")

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR

SUBSCRIPTION_TTL = 8 * HOUR  # of the simulated apps' subscriptions
DEFAULT_START = datetime(2024, 3, 4, tzinfo=UTC)  # a Monday, so commutes start on day one


@dataclass(frozen=True, kw_only=True, slots=True)
class GeneratorConfig:
    """What to generate. Every field has a default but ``users``, ``days`` and ``seed``."""

    users: int
    """Number of distinct users (AORs ``sip:u<n>@<domain>``)."""
    days: int
    """Length of the log in days, starting at ``start``."""
    seed: int
    """Everything is a function of the seed: the same seed gives the same bytes."""
    model: str = "commute"
    """One of :data:`MODELS`."""
    start: datetime = DEFAULT_START
    """First instant of the log (UTC)."""
    domain: str = "example.net"
    """Domain of the users' AORs."""
    notify_per_hour: float = 4.0
    """Mean rate of notifications published to each user."""
    urgent_fraction: float = 0.1
    """Share of notifications marked urgent (sent by SMS while disconnected)."""
    queue_limit: int = 40
    """Per-URI queue bound of the simulated broker; beyond it notifications are dropped."""
    sms_cost: float = 0.05
    """Price of one SMS segment."""
    duplicate_fraction: float = 0.001
    """Share of lines written twice (log shipping retries)."""
    reorder_fraction: float = 0.001
    """Share of lines swapped with the next one (concurrent writers)."""
    malformed_fraction: float = 0.0002
    """Share of lines truncated mid-object (a crash while writing)."""
    users_per_shard: int = 250
    """Users per output file; files are the unit of Spark's parallelism."""

    def __post_init__(self) -> None:
        if self.users < 1:
            raise OptionError("--users must be at least 1")
        if self.days < 1:
            raise OptionError("--days must be at least 1")
        if self.model not in MODELS:
            raise OptionError(f"--model must be one of {', '.join(MODELS)}, not {self.model!r}")
        if self.users_per_shard < 1:
            raise OptionError("users per shard must be at least 1")
        if self.start.tzinfo is None:
            raise OptionError("the start time must be timezone-aware")


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
    """The subnets and the outages shared by all users of one run."""

    subnets: list[Subnet]
    by_kind: dict[str, list[int]]
    outages: list[Outage] = field(default_factory=list)


_KINDS: tuple[tuple[str, str, int], ...] = (
    # kind, first two octets, how many /24s
    ("home", "10.1", 14),
    ("office", "10.20", 6),
    ("cafe", "10.30", 8),
    ("campus", "10.40", 16),
    ("cellular", "100.64", 4),
)


def build_world(cfg: GeneratorConfig) -> World:
    """The subnets and the outage schedule for a run (a function of the seed only)."""
    rng = random.Random(f"mdeci-gen:{cfg.seed}:world")
    subnets: list[Subnet] = []
    by_kind: dict[str, list[int]] = {}
    for kind, first, count in _KINDS:
        for i in range(count):
            by_kind.setdefault(kind, []).append(len(subnets))
            subnets.append(Subnet(kind, f"{first}.{i + 1}"))
    world = World(subnets, by_kind)
    span = cfg.days * DAY
    for index, subnet in enumerate(subnets):
        # Access networks fail now and then; a failure that hits many users at once is
        # what the storm detector must find. Busy kinds (office, campus) fail more often.
        per_day = {"office": 0.5, "campus": 0.7, "cellular": 0.3}.get(subnet.kind, 0.15)
        t = 0.0
        while True:
            t += rng.expovariate(per_day / DAY)
            if t >= span:
                break
            world.outages.append(
                Outage(index, int(t), int(rng.uniform(0.5, 4.0) * MINUTE)),
            )
    world.outages.sort(key=lambda o: o.at_ms)
    return world


# A stint: online on one subnet from start to end (ms since the log's start).
Stint = tuple[int, int, int]


def _commute(rng: random.Random, world: World, days: int, weekday0: int) -> list[Stint]:
    home = rng.choice(world.by_kind["home"])
    office = rng.choice(world.by_kind["office"])
    cafe = rng.choice(world.by_kind["cafe"])
    cell = world.by_kind["cellular"]
    out: list[Stint] = []
    t = 0  # when the user is next online
    for d in range(days):
        day0 = d * DAY
        if (weekday0 + d) % 7 < 5:
            leave = max(t + MINUTE, day0 + int(rng.uniform(7.2, 9.0) * HOUR))
            out.append((t, leave, home))
            t = _ride(rng, out, leave, int(rng.uniform(25, 60) * MINUTE), cell)
            if rng.random() < 0.3:
                lunch = max(t + MINUTE, day0 + int(rng.uniform(12.0, 13.0) * HOUR))
                out.append((t, lunch, office))
                t = lunch + int(rng.uniform(1, 4) * MINUTE)
                out.append((t, t + int(rng.uniform(25, 50) * MINUTE), cafe))
                t = out[-1][1] + int(rng.uniform(1, 4) * MINUTE)
            back = max(t + MINUTE, day0 + int(rng.uniform(16.5, 19.0) * HOUR))
            out.append((t, back, office))
            t = _ride(rng, out, back, int(rng.uniform(25, 60) * MINUTE), cell)
        else:
            outing = max(t + MINUTE, day0 + int(rng.uniform(10, 15) * HOUR))
            out.append((t, outing, home))
            t = outing + int(rng.uniform(1, 10) * MINUTE)
            out.append((t, t + int(rng.uniform(0.5, 3) * HOUR), rng.choice([cafe, *cell])))
            t = out[-1][1] + int(rng.uniform(1, 10) * MINUTE)
        if rng.random() < 0.4:
            # The phone is switched off for the night: a graceful gap, not a disconnection.
            bed = max(t + MINUTE, day0 + int(rng.uniform(22.5, 25.0) * HOUR))
            out.append((t, bed, home))
            t = day0 + DAY + int(rng.uniform(6.0, 7.5) * HOUR)
        # Otherwise it stays online at home; tomorrow's first stint continues this one.
    out.append((t, days * DAY, home))
    return out


def _ride(rng: random.Random, out: list[Stint], t: int, length: int, cell: list[int]) -> int:
    """Cellular stints on the way, broken by tunnels; returns the arrival time."""
    end = t + length
    t += int(rng.uniform(0.5, 3) * MINUTE)  # walk to the station: no coverage
    while t < end:
        stint = int(rng.uniform(4, 15) * MINUTE)
        out.append((t, min(end, t + stint), rng.choice(cell)))
        t = min(end, t + stint) + int(rng.lognormvariate(math.log(40_000), 0.8))
    return t + int(rng.uniform(0.5, 3) * MINUTE)


def _random(rng: random.Random, world: World, days: int, weekday0: int) -> list[Stint]:
    n = len(world.subnets)
    out: list[Stint] = []
    t = int(rng.uniform(0, 2) * HOUR)
    span = days * DAY
    while t < span:
        dwell = int(rng.expovariate(1 / (90 * MINUTE))) + MINUTE
        out.append((t, t + dwell, rng.randrange(n)))
        t += dwell
        if rng.random() < 0.5:
            t += int(rng.lognormvariate(math.log(2 * MINUTE), 1.2))
    return out


def _pervasive(rng: random.Random, world: World, days: int, weekday0: int) -> list[Stint]:
    campus = world.by_kind["campus"]
    home = rng.choice(world.by_kind["home"])
    flappy = rng.random() < 0.15  # some devices sit at the edge of two access points
    out: list[Stint] = []
    t = 0
    for d in range(days):
        day0 = d * DAY
        arrive = day0 + int(rng.uniform(7.5, 9.5) * HOUR)
        out.append((t, max(t + MINUTE, arrive), home))
        t = max(t + MINUTE, arrive) + int(rng.uniform(2, 20) * MINUTE)
        leave = day0 + int(rng.uniform(17, 21) * HOUR)
        ap = rng.choice(campus)
        while t < leave:
            if flappy and rng.random() < 0.08:
                # Flapping: two access points, a few tens of seconds on each.
                other = rng.choice(campus)
                for _ in range(rng.randint(6, 14)):
                    step = int(rng.uniform(15, 60) * 1000)
                    out.append((t, t + step, ap))
                    t += step
                    ap, other = other, ap
                continue
            dwell = int(rng.expovariate(1 / (12 * MINUTE))) + 20_000
            out.append((t, min(leave, t + dwell), ap))
            t = min(leave, t + dwell)
            if rng.random() < 0.1:
                t += int(rng.uniform(5, 30) * 1000)
            ap = rng.choice(campus)
        t += int(rng.uniform(5, 30) * MINUTE)
    out.append((t, max(t + MINUTE, days * DAY), home))
    return out


def _popup(rng: random.Random, world: World, days: int, weekday0: int) -> list[Stint]:
    spots = world.by_kind["cafe"] + world.by_kind["cellular"] + world.by_kind["campus"]
    out: list[Stint] = []
    for d in range(days):
        times = sorted(rng.uniform(7, 23) * HOUR for _ in range(rng.randint(3, 8)))
        for x in times:
            start = d * DAY + int(x)
            if out and start <= out[-1][1]:
                continue
            out.append((start, start + int(rng.uniform(5, 40) * MINUTE), rng.choice(spots)))
    return out


def _salesman(rng: random.Random, world: World, days: int, weekday0: int) -> list[Stint]:
    sites = world.by_kind["office"] + world.by_kind["cafe"]
    tour = rng.sample(sites, rng.randint(4, 7))  # the salesman's fixed route
    home = rng.choice(world.by_kind["home"])
    cell = world.by_kind["cellular"]
    out: list[Stint] = []
    t = 0
    for d in range(days):
        day0 = d * DAY
        leave = day0 + int(rng.uniform(7.5, 9.0) * HOUR)
        out.append((t, max(t + MINUTE, leave), home))
        t = max(t + MINUTE, leave)
        if (weekday0 + d) % 7 < 5:
            for site in tour:
                t = _ride(rng, out, t, int(rng.uniform(15, 45) * MINUTE), cell)
                stay = int(rng.uniform(45, 120) * MINUTE)
                out.append((t, t + stay, site))
                t += stay
            t = _ride(rng, out, t, int(rng.uniform(15, 45) * MINUTE), cell)
        end = day0 + DAY + int(rng.uniform(6, 7) * HOUR)
        out.append((t, max(t + MINUTE, end), home))
        t = max(t + MINUTE, end)
    return out


_MODEL_FUNCS: dict[str, Callable[[random.Random, World, int, int], list[Stint]]] = {
    "random": _random,
    "commute": _commute,
    "pervasive": _pervasive,
    "popup": _popup,
    "salesman": _salesman,
}


def _clean(stints: list[Stint], span: int) -> list[Stint]:
    """Clip to the log, drop empty stints, merge touching stints on the same subnet."""
    out: list[Stint] = []
    for start, end, subnet in sorted(stints):
        start = max(start, out[-1][1] if out else 0)
        end = min(end, span)
        if end <= start:
            continue
        if out and out[-1][1] == start and out[-1][2] == subnet:
            out[-1] = (out[-1][0], end, subnet)
        else:
            out.append((start, end, subnet))
    return out


def _apply_outages(stints: list[Stint], world: World, rng: random.Random) -> list[Stint]:
    """Cut every stint that is on a subnet while it fails; the user comes back after it."""
    if not world.outages:
        return stints
    out: list[Stint] = []
    by_subnet: dict[int, list[Outage]] = {}
    for o in world.outages:
        by_subnet.setdefault(o.subnet, []).append(o)
    for start, end, subnet in stints:
        for o in by_subnet.get(subnet, ()):
            if start < o.at_ms < end:
                back = o.at_ms + o.duration_ms + int(rng.uniform(0, 40_000))
                out.append((start, o.at_ms, subnet))
                start = min(back, end)
        if start < end:
            out.append((start, end, subnet))
    return out


class _Fmt:
    """RFC 3339 timestamps with milliseconds, without datetime on the hot path."""

    def __init__(self, start: datetime, days: int) -> None:
        self.base_ms = int(start.timestamp() * 1000)
        self.prefix = [(start + timedelta(days=d)).strftime("%Y-%m-%dT") for d in range(days + 2)]
        if start.hour or start.minute or start.second or start.microsecond:
            raise OptionError("the start time must be midnight UTC")

    def ts(self, t: int) -> str:
        d, rest = divmod(t, DAY)
        h, rest = divmod(rest, HOUR)
        m, rest = divmod(rest, MINUTE)
        s, ms = divmod(rest, 1000)
        return f"{self.prefix[d]}{h:02d}:{m:02d}:{s:02d}.{ms:03d}Z"


class _UserLog:
    """Plays one user's timeline into (t, line) pairs."""

    def __init__(self, cfg: GeneratorConfig, world: World, fmt: _Fmt, index: int) -> None:
        self.cfg = cfg
        self.world = world
        self.fmt = fmt
        self.rng = random.Random(f"mdeci-gen:{cfg.seed}:user:{index}")
        self.uri = f"sip:u{index:06d}@{cfg.domain}"
        self.agent = f"agent-u{index:06d}"
        self.broker = "broker-1"
        self.index = index
        self.events: list[tuple[int, str]] = []
        self.call_id = ""
        self.calls = 0
        self.addr = ""
        self.nseq = 0
        self.queue: list[tuple[int, int]] = []  # (nseq, queued at)

    # -- line writers: one per event shape; the strings need no JSON escaping --
    def _head(self, t: int, node: str, event: str) -> str:
        role = "agent" if node == self.agent else "broker"
        return (
            f'{{"ts":"{self.fmt.ts(t)}","node":"{node}","role":"{role}","event":"{event}",'
            f'"uri":"{self.uri}"'
        )

    def simple(self, t: int, node: str, event: str, tail: str = "") -> None:
        self.events.append((t, f"{self._head(t, node, event)}{tail}}}"))

    def new_addr(self, subnet: int) -> str:
        host = self.rng.randint(2, 254)
        port = self.rng.randint(20000, 60000)
        return f"{self.world.subnets[subnet].prefix}.{host}:{port}"

    def play(self, stints: list[Stint], span: int) -> list[tuple[int, str]]:
        """All events of this user, roughly in time order (flushes may overlap)."""
        rng = self.rng
        cfg = self.cfg
        rate = cfg.notify_per_hour / HOUR
        arrivals: list[int] = []
        t = rng.expovariate(rate) if rate > 0 else span
        while t < span:
            arrivals.append(int(t))
            t += rng.expovariate(rate)
        ai = 0
        session = False  # a dialog exists (ended only by a graceful gap)
        registered_until = 0
        expired = False  # the subscriptions ran out during the last gap
        for i, (start, end, subnet) in enumerate(stints):
            prev_end = stints[i - 1][1] if i else -1
            gap = start - prev_end if i else -1
            # Notifications published before we are back: queued, dropped or by SMS.
            ai = self._offline_arrivals(arrivals, ai, start)
            if gap > 0 and session and start - prev_end > 600_000 and registered_until:
                # The registration ran out while the device was away (Expires: 600).
                self.simple(registered_until, self.broker, "registration_expired")
                registered_until = 0
            new = self.new_addr(subnet)
            restore = round(rng.lognormvariate(math.log(350), 0.7), 1)
            up = start + max(1, int(restore))
            if not session:
                self.calls += 1
                self.call_id = f"{self.index:x}-{self.calls:x}@{self.uri[4:]}"
                self.addr = new
                self.simple(start, self.broker, "registered", f',"addr":"{new}"')
                self.simple(
                    start + 3,
                    self.broker,
                    "session_started",
                    f',"call_id":"{self.call_id}","addr":"{new}"',
                )
                if self.calls == 1:
                    for k in range(rng.randint(1, 3)):
                        self.simple(start + 4 + k, self.broker, "subscription_added")
                elif expired:
                    # Its subscriptions ran out while it was off; the app subscribes again.
                    self.simple(start + 4, self.broker, "subscription_added")
                elif rng.random() < 0.2:
                    # Interests change: one subscription swapped for another.
                    self.simple(start + 4, self.broker, "subscription_removed")
                    self.simple(start + 5, self.broker, "subscription_added")
                session = True
                expired = False
            else:
                self.simple(
                    start,
                    self.agent,
                    "ip_changed",
                    f',"addr":"{new}","prev_addr":"{self.addr}","reason":"'
                    + ("handover" if gap == 0 else "reattach")
                    + '"',
                )
                prev = self.addr
                self.addr = new
                self.simple(start + 2, self.broker, "registered", f',"addr":"{new}"')
                self.simple(
                    start + 4,
                    self.broker,
                    "session_reinvited",
                    f',"call_id":"{self.call_id}","addr":"{new}","prev_addr":"{prev}"',
                )
            # Both ends see the media come up: the broker's line is the connection state,
            # the agent's carries the restore latency the device measured.
            self.simple(
                up, self.broker, "media_connected", f',"call_id":"{self.call_id}","addr":"{new}"'
            )
            self.simple(
                up,
                self.agent,
                "media_connected",
                f',"call_id":"{self.call_id}","addr":"{new}","latency_ms":{restore}',
            )
            registered_until = 0
            # Flush the queue in order once the media is up again.
            depth = len(self.queue)
            for k, (nseq, queued) in enumerate(self.queue):
                at = up + 5 * (k + 1)
                depth -= 1
                self._delivered(at, nseq, float(at - queued), depth, "ip")
            self.queue.clear()
            # Connected: each notification is queued and delivered within milliseconds.
            while ai < len(arrivals) and arrivals[ai] < end:
                at = max(arrivals[ai], up + 5 * (depth + 1))
                ai += 1
                self.nseq += 1
                self._queued(at, self.nseq, 1)
                lat = round(rng.lognormvariate(math.log(40), 0.5), 1)
                self._delivered(at + max(1, int(lat)), self.nseq, lat, 0, "ip")
            nxt = stints[i + 1][0] if i + 1 < len(stints) else span
            if nxt == end:
                continue  # seamless handover: the next stint re-INVITEs at once
            if nxt - end > 5 * HOUR and rng.random() < 0.7:
                # A long gap is usually the phone switched off: a clean shutdown.
                self.simple(end, self.agent, "session_ended", f',"call_id":"{self.call_id}"')
                self.simple(end, self.broker, "session_ended", f',"call_id":"{self.call_id}"')
                self.simple(end + 2, self.broker, "unregistered")
                session = False
                if nxt - end > SUBSCRIPTION_TTL and rng.random() < 0.5:
                    self.simple(end + SUBSCRIPTION_TTL, self.broker, "subscription_expired")
                    expired = True
            elif end < span:
                self.simple(
                    end,
                    self.broker,
                    "media_disconnected",
                    f',"call_id":"{self.call_id}","addr":"{self.addr}",'
                    '"reason":"rudp retries exhausted"',
                )
                registered_until = end + 600_000
        self._offline_arrivals(arrivals, ai, span)
        return self.events

    def _queued(self, t: int, nseq: int, depth: int) -> None:
        self.simple(t, self.broker, "notify_queued", f',"nseq":{nseq},"queue_depth":{depth}')

    def _delivered(self, t: int, nseq: int, lat: float, depth: int, channel: str) -> None:
        self.simple(
            t,
            self.broker,
            "notify_delivered",
            f',"channel":"{channel}","nseq":{nseq},"queue_depth":{depth},'
            f'"latency_ms":{round(lat, 1)}',
        )

    def _offline_arrivals(self, arrivals: list[int], ai: int, until: int) -> int:
        rng = self.rng
        cfg = self.cfg
        while ai < len(arrivals) and arrivals[ai] < until:
            at = arrivals[ai]
            ai += 1
            if len(self.queue) >= cfg.queue_limit:
                self.simple(
                    at,
                    self.broker,
                    "notify_dropped",
                    f',"queue_depth":{len(self.queue)},"reason":"queue_full"',
                )
                continue
            self.nseq += 1
            self.queue.append((self.nseq, at))
            self._queued(at, self.nseq, len(self.queue))
            if rng.random() < cfg.urgent_fraction:
                size = rng.randint(60, 400)
                segments = max(1, math.ceil(size / 134))  # 140 octets less the UDH
                cost = round(segments * cfg.sms_cost, 4)
                self.simple(
                    at + 1,
                    self.broker,
                    "sms_sent",
                    f',"channel":"sms","nseq":{self.nseq},"bytes":{size},"cost":{cost}',
                )
                if rng.random() < 0.95:
                    lag = int(rng.uniform(2, 30) * 1000)
                    self.simple(at + lag, self.agent, "sms_received", ',"channel":"sms"')
                    self.queue.pop()
                    self._delivered(at + lag + 3, self.nseq, float(lag + 3), len(self.queue), "sms")
        return ai


def user_lines(cfg: GeneratorConfig, world: World, fmt: _Fmt, index: int) -> list[str]:
    """The log lines of one user, sorted by time (a pure function of seed and index)."""
    log = _UserLog(cfg, world, fmt, index)
    span = cfg.days * DAY
    stints = _MODEL_FUNCS[cfg.model](log.rng, world, cfg.days, cfg.start.weekday())
    stints = _clean(_apply_outages(_clean(stints, span), world, log.rng), span)
    if stints and stints[0][0] == 0:
        # Users already online when the log begins: their first lines are spread out, or
        # every log would open with a "storm" of all users registering at midnight.
        first = stints[0]
        stints[0] = (min(first[1] - 1, int(log.rng.uniform(0, 20) * MINUTE)), first[1], first[2])
    events = log.play(stints, span)
    events.sort(key=lambda e: e[0])
    return [line for _, line in events]


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """What :func:`generate` wrote."""

    events: int
    lines: int
    files: list[Path]


def _shards(cfg: GeneratorConfig) -> Iterator[range]:
    for lo in range(0, cfg.users, cfg.users_per_shard):
        yield range(lo, min(cfg.users, lo + cfg.users_per_shard))


def _mangle(lines: list[str], cfg: GeneratorConfig, rng: random.Random) -> list[str]:
    """Duplicates, swapped neighbours and truncated lines, as shipped logs have them."""
    out: list[str] = []
    for line in lines:
        r = rng.random()
        if r < cfg.malformed_fraction:
            out.append(line[: rng.randrange(1, len(line) - 1)])
            continue
        out.append(line)
        if r < cfg.malformed_fraction + cfg.duplicate_fraction:
            out.append(line)
        elif r < cfg.malformed_fraction + cfg.duplicate_fraction + cfg.reorder_fraction and (
            len(out) >= 2
        ):
            out[-1], out[-2] = out[-2], out[-1]
    return out


def generate(
    cfg: GeneratorConfig,
    out_dir: Path,
    *,
    jsonl: bool = True,
    parquet: bool = True,
    progress: Callable[[int], None] | None = None,
) -> GenerateResult:
    """Write the log of ``cfg`` under ``out_dir`` (``jsonl/`` and ``parquet/``).

    Users are interleaved in time within a file, as a broker's log is. ``progress`` is
    called with the number of users finished since the last call.

    Raises:
        OptionError: if neither format is asked for.
        OSError: if the files cannot be written.
    """
    if not (jsonl or parquet):
        raise OptionError("nothing to write: ask for JSON lines, Parquet or both")
    world = build_world(cfg)
    fmt = _Fmt(cfg.start, cfg.days)
    files: list[Path] = []
    events = 0
    lines_written = 0
    if jsonl:
        (out_dir / "jsonl").mkdir(parents=True, exist_ok=True)
    if parquet:
        (out_dir / "parquet").mkdir(parents=True, exist_ok=True)
    for shard, users in enumerate(_shards(cfg)):
        per_user = []
        for index in users:
            per_user.append(user_lines(cfg, world, fmt, index))
            if progress is not None:
                progress(1)
        # Interleave the users by time; ts strings sort as the instants they name.
        merged = list(heapq.merge(*per_user, key=lambda line: line[7:31]))
        events += len(merged)
        if jsonl:
            rng = random.Random(f"mdeci-gen:{cfg.seed}:shard:{shard}")
            mangled = _mangle(merged, cfg, rng)
            path = out_dir / "jsonl" / f"churn-{shard:05d}.jsonl"
            with path.open("w", encoding="utf-8", newline="\n") as f:
                f.write("\n".join(mangled))
                f.write("\n")
            files.append(path)
            lines_written += len(mangled)
        if parquet:
            path = out_dir / "parquet" / f"churn-{shard:05d}.parquet"
            _write_parquet(merged, path)
            files.append(path)
    return GenerateResult(events=events, lines=lines_written, files=files)


def _write_parquet(lines: list[str], path: Path) -> None:
    """The Parquet copy of clean lines, parsed by Arrow's C++ JSON reader (fast)."""
    import pyarrow as pa
    from pyarrow import json as pajson
    from pyarrow import parquet as pq

    types = {
        "queue_depth": pa.int64(),
        "nseq": pa.int64(),
        "bytes": pa.int64(),
        "latency_ms": pa.float64(),
        "cost": pa.float64(),
    }
    from analytics.schema import FIELD_NAMES

    schema = pa.schema([(name, types.get(name, pa.string())) for name in FIELD_NAMES])
    data = ("\n".join(lines) + "\n").encode("utf-8")
    table = pajson.read_json(
        io.BytesIO(data),
        read_options=pajson.ReadOptions(block_size=1 << 24),
        parse_options=pajson.ParseOptions(
            explicit_schema=schema, unexpected_field_behavior="ignore"
        ),
    )
    pq.write_table(table, path, compression="snappy")
