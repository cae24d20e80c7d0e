"""Each mobility model's defining property, checked statistically on a generated log.

The logs are generated without outages (a failed network cuts a stay short, which is
the world's doing, not the model's) and read back as a log reader would
(tests/analytics/timelines.py). Seeds are fixed: a test that passes passes every time.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analytics.generate import GeneratorConfig, build_world, generate
from analytics.mobility import MobilityParams
from tests.analytics.timelines import (
    Stint,
    exponential_cdf,
    ks_p_value,
    stints,
    uniform_cdf,
)

QUIET: dict[str, Any] = {
    "duplicate_fraction": 0.0,
    "reorder_fraction": 0.0,
    "malformed_fraction": 0.0,
    "outages": False,
    "notify_per_hour": 0.5,
}
MINUTE = 60_000.0
LOG_START_MS = 1_709_510_400_000  # 2024-03-04T00:00Z, a Monday (the default start)


def _log(tmp_path: Path, model: str, users: int, days: int, **extra: Any) -> tuple[Any, ...]:
    cfg = GeneratorConfig(users=users, days=days, seed=29, model=model, **{**QUIET, **extra})
    generate(cfg, tmp_path, parquet=False)
    world = build_world(cfg)
    index = world.subnet_of_prefix()
    return cfg, world, index, stints(tmp_path)


def _moves(timelines: dict[str, list[Stint]]) -> list[tuple[Stint, Stint]]:
    return [(a, b) for ss in timelines.values() for a, b in itertools.pairwise(ss)]


def _inner(timelines: dict[str, list[Stint]]) -> list[Stint]:
    """Stays that neither begin the log nor end it (those are cut by its edges)."""
    return [s for ss in timelines.values() for s in ss[1:-1]]


def test_jecho_salesman_moves_only_to_a_neighbour_of_its_node(tmp_path: Path) -> None:
    _cfg, world, index, timelines = _log(tmp_path, "jecho-salesman", users=30, days=4)
    moves = _moves(timelines)
    assert len(moves) > 1000
    off = [
        (a.prefix, b.prefix)
        for a, b in moves
        if index[b.prefix] not in world.neighbours[index[a.prefix]]
    ]
    assert off == []
    # A walk, not a teleport: most nodes are not neighbours of a given node.
    assert max(len(n) for n in world.neighbours) < len(world.subnets) // 4


@pytest.mark.parametrize("share", [0.2, 0.45])
def test_jecho_popup_remote_jumps_take_the_configured_share(tmp_path: Path, share: float) -> None:
    params = MobilityParams(remote_share=share)
    _cfg, world, index, timelines = _log(tmp_path, "jecho-popup", 30, 4, mobility=params)
    moves = _moves(timelines)
    remote = sum(index[b.prefix] not in world.neighbours[index[a.prefix]] for a, b in moves)
    n = len(moves)
    sigma = (n * share * (1 - share)) ** 0.5
    assert abs(remote - n * share) < 4 * sigma, (remote, n, share)


@pytest.mark.parametrize("share", [0.8, 0.6])
def test_jecho_fixed_two_favourites_take_the_configured_share_of_time(
    tmp_path: Path, share: float
) -> None:
    params = MobilityParams(favourite_share=share)
    _cfg, _world, _index, timelines = _log(tmp_path, "jecho-fixed", 40, 7, mobility=params)
    at_favourites = total = 0
    for ss in timelines.values():
        time: Counter[str] = Counter()
        for s in ss[1:-1]:
            time[s.prefix] += s.length
        at_favourites += sum(v for _, v in time.most_common(2))
        total += sum(time.values())
    assert abs(at_favourites / total - share) < 0.04, at_favourites / total


def test_walkabout_random_periods_are_uniform_on_10_to_30_minutes(tmp_path: Path) -> None:
    _cfg, _world, _index, timelines = _log(tmp_path, "walkabout-random", 20, 3)
    up = [s.length / MINUTE for s in _inner(timelines)]
    down = [(b.start - a.end) / MINUTE for a, b in _moves(timelines)]
    assert len(up) > 1000 and len(down) > 1000
    for sample in (up, down):
        assert ks_p_value(sample, uniform_cdf(10, 30)) > 0.01
        # The test can tell: the same sample is not uniform on a range 10 % wider.
        assert ks_p_value(sample, uniform_cdf(10, 32)) < 0.01


@pytest.mark.parametrize("model", ["jecho-random", "jecho-salesman", "jecho-popup", "jecho-fixed"])
def test_jecho_dwell_times_are_exponential_with_the_configured_mean(
    tmp_path: Path, model: str
) -> None:
    params = MobilityParams(dwell_mean_min=45.0)
    _cfg, _world, _index, timelines = _log(tmp_path, model, 20, 4, mobility=params)
    dwell = [s.length / MINUTE for s in _inner(timelines)]
    assert len(dwell) > 1000
    assert ks_p_value(dwell, exponential_cdf(45.0)) > 0.01
    assert ks_p_value(dwell, exponential_cdf(52.0)) < 0.01
    # Every move is a handover: JECho's devices stay connected.
    assert all(a.end == b.start for a, b in _moves(timelines))


def test_walkabout_commute_office_from_8_to_9_then_an_extended_disconnection_home(
    tmp_path: Path,
) -> None:
    cfg, world, _index, timelines = _log(tmp_path, "walkabout-commute", 30, 7)
    kinds = {s.prefix: s.kind for s in world.subnets}
    office_days = 0
    for ss in timelines.values():
        for prev, stay in itertools.pairwise(ss):
            assert kinds[stay.prefix] in ("home", "office")
            assert kinds[prev.prefix] != kinds[stay.prefix]
            gap = (stay.start - prev.end) / MINUTE
            lo, hi = cfg.mobility.ride_min
            assert lo <= gap <= hi + 1  # no network at all on the ride
            if kinds[stay.prefix] == "office":
                office_days += 1
                day_ms = (stay.start - LOG_START_MS) % 86_400_000
                assert 8 * 60 <= day_ms / MINUTE < 9 * 60
                assert (stay.start - LOG_START_MS) // 86_400_000 % 7 < 5  # a working day
                if stay is not ss[-1]:
                    assert 7.5 * 60 <= stay.length / MINUTE <= 8.5 * 60
    assert office_days >= 30 * 4


def test_walkabout_pervasive_moves_regularly_each_through_a_short_break(tmp_path: Path) -> None:
    _cfg, world, _index, timelines = _log(tmp_path, "walkabout-pervasive", 10, 2)
    campus = {world.subnets[i].prefix for i in world.by_kind["campus"]}
    moves = _moves(timelines)
    assert len(moves) > 2000
    gaps = [(b.start - a.end) / 1000 for a, b in moves]
    assert min(gaps) >= 5 and max(gaps) <= 30
    assert all(b.prefix != a.prefix and b.prefix in campus for a, b in moves)
    stays = [s.length / MINUTE for s in _inner(timelines)]
    assert min(stays) >= 9 and max(stays) <= 11


@pytest.mark.parametrize("ratio", [0.5, 2.0])
def test_mobility_ratio_sets_moves_per_notification(tmp_path: Path, ratio: float) -> None:
    cfg = GeneratorConfig(
        users=20, days=3, seed=3, model="jecho-salesman", mobility_ratio=ratio, **QUIET
    )
    cfg = replace(cfg, notify_per_hour=99.0)  # ignored: the ratio decides
    generate(cfg, tmp_path, parquet=False)
    moves = sum(len(ss) - 1 for ss in stints(tmp_path).values())
    counts: defaultdict[str, int] = defaultdict(int)
    for path in (tmp_path / "jsonl").glob("*.jsonl"):
        for raw in path.read_text("utf-8").splitlines():
            if '"event":"notify_queued"' in raw:
                counts["queued"] += 1
    assert abs(moves / counts["queued"] - ratio) < 0.1 * ratio
