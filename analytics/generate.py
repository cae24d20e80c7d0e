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

Models (the ``--model`` option): the seven of :mod:`analytics.mobility`, each named
after its paper, JECho's four (``jecho-random``, ``jecho-salesman``, ``jecho-popup``,
``jecho-fixed``) and Walkabout's three (``walkabout-commute``, ``walkabout-pervasive``,
``walkabout-random``). ``commute``, ``pervasive``, ``popup`` and ``salesman`` name the
one model of that name; ``random`` is refused, as it names two.

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
from analytics.mobility import (
    DAY,
    HOUR,
    KINDS,
    MINUTE,
    MODEL_FUNCS,
    MobilityParams,
    Outage,
    Stint,
    Subnet,
    World,
    build_topology,
    moves_per_hour,
    walkabout_commute,
)

MODELS: tuple[str, ...] = tuple(MODEL_FUNCS)
# The short names of earlier logs' models, each naming one paper's model.
ALIASES: dict[str, str] = {
    "commute": "walkabout-commute",
    "pervasive": "walkabout-pervasive",
    "popup": "jecho-popup",
    "salesman": "jecho-salesman",
}

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
    model: str = "walkabout-commute"
    """One of :data:`MODELS` (or of :data:`ALIASES`, read as the model it names)."""
    start: datetime = DEFAULT_START
    """First instant of the log (UTC)."""
    domain: str = "example.net"
    """Domain of the users' AORs."""
    notify_per_hour: float = 4.0
    """Mean rate of notifications published to each user (unless ``mobility_ratio``)."""
    mobility_ratio: float | None = None
    """JECho's mobility-to-communication ratio: the model's moves per notification; when
    set, the notification rate is the model's move rate divided by it."""
    mobility: MobilityParams = field(default_factory=MobilityParams)
    """The models' figures (:class:`analytics.mobility.MobilityParams`)."""
    outages: bool = True
    """Whether access networks fail now and then (off for the models' own statistics)."""
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
    resend_fraction: float = 0.3
    """Share of moves that lose the ack of the last delivery before them: the broker sends
    it again after the move and the agent's gate refuses it (a duplicate per move)."""
    brokers: int = 1
    """Brokers of the deployment (``node`` of the broker's lines); users are spread."""
    failover_fraction: float = 0.05
    """With several brokers: share of reattaches that land on another broker (a new
    session there, the old one never ended: a failover)."""
    users_per_shard: int = 250
    """Users per output file; files are the unit of Spark's parallelism."""

    def __post_init__(self) -> None:
        if self.users < 1:
            raise OptionError("--users must be at least 1")
        if self.days < 1:
            raise OptionError("--days must be at least 1")
        if self.model in ALIASES:
            object.__setattr__(self, "model", ALIASES[self.model])
        if self.model not in MODELS:
            raise OptionError(f"--model must be one of {', '.join(MODELS)}, not {self.model!r}")
        if self.mobility_ratio is not None and not self.mobility_ratio > 0:
            raise OptionError("--mobility-ratio must be positive")
        share = (self.mobility.remote_share, self.mobility.favourite_share)
        if not all(0.0 <= x <= 1.0 for x in share):
            raise OptionError("--remote-share and --favourite-share must be within [0, 1]")
        if self.brokers < 1:
            raise OptionError("--brokers must be at least 1")
        if self.users_per_shard < 1:
            raise OptionError("users per shard must be at least 1")
        if self.start.tzinfo is None:
            raise OptionError("the start time must be timezone-aware")

    @property
    def notify_rate(self) -> float:
        """Notifications per user per hour: ``notify_per_hour``, or the model's moves per
        hour over ``mobility_ratio``."""
        if self.mobility_ratio is None:
            return self.notify_per_hour
        return moves_per_hour(self.model, self.mobility) / self.mobility_ratio


def build_world(cfg: GeneratorConfig) -> World:
    """The subnets, their topology and the outage schedule of a run (a function of the
    seed only; the topology has its own stream, so the outages do not depend on it)."""
    rng = random.Random(f"mdeci-gen:{cfg.seed}:world")
    subnets: list[Subnet] = []
    by_kind: dict[str, list[int]] = {}
    for kind, first, count in KINDS:
        for i in range(count):
            by_kind.setdefault(kind, []).append(len(subnets))
            subnets.append(Subnet(kind, f"{first}.{i + 1}"))
    topology = random.Random(f"mdeci-gen:{cfg.seed}:topology")
    world = World(subnets, by_kind, build_topology(len(subnets), topology, len(subnets) // 2))
    if not cfg.outages:
        return world
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


def timeline(cfg: GeneratorConfig, world: World, rng: random.Random) -> list[Stint]:
    """One user's stints under ``cfg.model``, before the world's outages cut them."""
    params = cfg.mobility
    if cfg.model == "walkabout-commute":
        return walkabout_commute(rng, world, cfg.days, params, cfg.start.weekday())
    return MODEL_FUNCS[cfg.model](rng, world, cfg.days, params)


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
        self.broker = f"broker-{index % cfg.brokers + 1}"
        self.index = index
        self.events: list[tuple[int, str]] = []
        self.call_id = ""
        self.calls = 0
        self.addr = ""
        self.nseq = 0
        self.queue: list[tuple[int, int]] = []  # (nseq, queued at)
        self.dropped = 0  # dropped since the last delivery: the next one says so
        self.last_ip = 0  # nseq of the last delivery by IP (0: none yet)

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
        rate = cfg.notify_rate / HOUR
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
                # The device's outbox goes on the new network: its decision.
                self.simple(
                    start + 1,
                    self.agent,
                    "publish_decided",
                    ',"channel":"ip","reason":"network=wifi class=normal decision=deliver"',
                )
                prev = self.addr
                self.addr = new
                failover = cfg.brokers > 1 and gap > 0 and rng.random() < cfg.failover_fraction
                if failover:
                    # Its broker went silent under the device (which notices and says so),
                    # and the device comes back through another broker: a new session there,
                    # which takes the user over from the silent one.
                    self.simple(start - 1, self.agent, "broker_lost", f',"addr":"{prev}"')
                    lost_broker = self.broker
                    self.broker = f"broker-{(int(self.broker[7:]) % cfg.brokers) + 1}"
                    self.simple(start + 3, self.broker, "handoff", f',"prev_node":"{lost_broker}"')
                    self.calls += 1
                    self.call_id = f"{self.index:x}-{self.calls:x}@{self.uri[4:]}"
                self.simple(start + 2, self.broker, "registered", f',"addr":"{new}"')
                self.simple(
                    start + 4,
                    self.broker,
                    "session_started" if failover else "session_reinvited",
                    f',"call_id":"{self.call_id}","addr":"{new}"'
                    + ("" if failover else f',"prev_addr":"{prev}"'),
                )
                if self.last_ip and rng.random() < cfg.resend_fraction:
                    # The ack of the last delivery was lost in the move: sent again.
                    self.simple(
                        up + 1,
                        self.agent,
                        "notify_duplicate",
                        f',"channel":"ip","nseq":{self.last_ip}',
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

    def _delivered(
        self, t: int, nseq: int, lat: float, depth: int, channel: str, size: int = 0
    ) -> None:
        """The broker's delivery (the fact) and the device's: its bytes, its publish
        instant and the end-to-end latency; a gap line first if notifications were
        dropped since the last delivery."""
        self.simple(
            t,
            self.broker,
            "notify_delivered",
            f',"channel":"{channel}","nseq":{nseq},"queue_depth":{depth},'
            f'"latency_ms":{round(lat, 1)}',
        )
        if self.dropped:
            self.simple(
                t,
                self.agent,
                "notify_gap",
                f',"channel":"{channel}","nseq":{nseq},"missed":{self.dropped}',
            )
            self.dropped = 0
        size = size or 200 + nseq * 7919 % 1800
        published = t - max(1, int(lat))
        self.simple(
            t,
            self.agent,
            "notify_delivered",
            f',"channel":"{channel}","nseq":{nseq},"latency_ms":{float(t - published)},'
            f'"bytes":{size},"published":"{self.fmt.ts(published)}"',
        )
        if channel == "ip":
            self.last_ip = nseq

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
                self.dropped += 1
                continue
            self.nseq += 1
            self.queue.append((self.nseq, at))
            self._queued(at, self.nseq, len(self.queue))
            if rng.random() < cfg.urgent_fraction:
                size = rng.randint(60, 400)
                segments = max(1, math.ceil(size / 134))  # 140 octets less the UDH
                cost = round(segments * cfg.sms_cost, 4)
                self.simple(
                    at,
                    self.broker,
                    "channel_decided",
                    f',"channel":"sms","nseq":{self.nseq},"bytes":{size},"cost":{cost},'
                    '"reason":"network=none class=urgent decision=sms"',
                )
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
                    depth = len(self.queue)
                    self._delivered(at + lag + 3, self.nseq, float(lag + 3), depth, "sms", size)
        return ai


def user_lines(cfg: GeneratorConfig, world: World, fmt: _Fmt, index: int) -> list[str]:
    """The log lines of one user, sorted by time (a pure function of seed and index)."""
    log = _UserLog(cfg, world, fmt, index)
    span = cfg.days * DAY
    stints = timeline(cfg, world, log.rng)
    stints = _clean(_apply_outages(_clean(stints, span), world, log.rng), span)
    if stints and stints[0][0] == 0:
        # Users already online when the log begins: their first lines are spread out, or
        # every log would open with a "storm" of all users registering at midnight.
        # A first stay shorter than that keeps its start: its lines and the next stay's
        # would otherwise share a millisecond.
        first = stints[0]
        spread = int(log.rng.uniform(0, 20) * MINUTE)
        if spread < first[1] - MINUTE:
            stints[0] = (spread, first[1], first[2])
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
        "missed": pa.int64(),
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
