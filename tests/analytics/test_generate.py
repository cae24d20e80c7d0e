"""The log generator: deterministic per seed, the whole vocabulary, plausible sequences."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analytics.errors import OptionError
from analytics.generate import MODELS, GeneratorConfig, generate
from analytics.mobility import MobilityParams
from analytics.schema import EVENTS, FIELD_NAMES

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
CLEAN: dict[str, Any] = {
    "duplicate_fraction": 0.0,
    "reorder_fraction": 0.0,
    "malformed_fraction": 0.0,
}


def _lines(directory: Path) -> list[str]:
    return [x for p in sorted(directory.glob("jsonl/*.jsonl")) for x in p.read_text().splitlines()]


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    cfg = GeneratorConfig(users=6, days=2, seed=7, model="jecho-random")
    generate(cfg, tmp_path / "a")
    generate(cfg, tmp_path / "b")
    generate(replace(cfg, seed=8), tmp_path / "c")
    a, b, c = (_lines(tmp_path / d) for d in "abc")
    assert a == b
    assert a != c
    pa = (tmp_path / "a/parquet/churn-00000.parquet").read_bytes()
    assert pa == (tmp_path / "b/parquet/churn-00000.parquet").read_bytes()


def test_a_users_log_does_not_depend_on_sharding(tmp_path: Path) -> None:
    cfg = GeneratorConfig(users=5, days=1, seed=3, model="pervasive", **CLEAN)
    generate(cfg, tmp_path / "one", parquet=False)
    generate(replace(cfg, users_per_shard=2), tmp_path / "three", parquet=False)
    assert len(list((tmp_path / "three/jsonl").iterdir())) == 3
    assert sorted(_lines(tmp_path / "one")) == sorted(_lines(tmp_path / "three"))


def test_parquet_copy_holds_the_clean_events(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    cfg = GeneratorConfig(users=4, days=1, seed=5, model="popup", **CLEAN)
    result = generate(cfg, tmp_path)
    table = pq.read_table(tmp_path / "parquet")
    assert table.num_rows == result.events == len(_lines(tmp_path))
    assert table.column_names == list(FIELD_NAMES)


def test_every_model_writes_valid_records_and_all_models_the_whole_vocabulary(
    tmp_path: Path,
) -> None:
    seen: Counter[str] = Counter()
    per_model: dict[str, Counter[str]] = {}
    for model in MODELS:
        # Nights off, a short queue and two brokers: the session ends, expiries, drops and
        # failovers (a broker the device lost) of the vocabulary.
        cfg = GeneratorConfig(
            users=12,
            days=3,
            seed=11,
            model=model,
            queue_limit=4,
            brokers=2,
            mobility=MobilityParams(night_off_share=0.5),
            **CLEAN,
        )
        generate(cfg, tmp_path / model, parquet=False)
        counts: Counter[str] = Counter()
        last_addr: dict[str, str] = {}
        for raw in _lines(tmp_path / model):
            r = json.loads(raw)
            assert set(r) <= set(FIELD_NAMES)
            assert TS.match(r["ts"]) and r["uri"].startswith("sip:")
            counts[r["event"]] += 1
            # A move starts where the user was: prev_addr is the address it had.
            if r["event"] == "ip_changed":
                assert r["prev_addr"] == last_addr[r["uri"]]
            if r["event"] in ("ip_changed", "session_started"):
                last_addr[r["uri"]] = r["addr"]
        per_model[model] = counts
        seen.update(counts)
    assert set(seen) == set(EVENTS)
    # The models differ the way the papers describe them: Walkabout's pervasive device
    # moves most, its random one is disconnected most, JECho's devices never are.
    assert (
        per_model["walkabout-pervasive"]["ip_changed"] > 3 * per_model["jecho-popup"]["ip_changed"]
    )
    assert per_model["walkabout-random"]["sms_sent"] > per_model["walkabout-commute"]["sms_sent"]
    assert (
        per_model["jecho-salesman"]["media_disconnected"]
        < per_model["walkabout-random"]["media_disconnected"] / 10
    )


def test_the_short_model_names_name_one_model_and_random_names_two() -> None:
    assert GeneratorConfig(users=1, days=1, seed=1, model="commute").model == "walkabout-commute"
    assert GeneratorConfig(users=1, days=1, seed=1, model="salesman").model == "jecho-salesman"
    with pytest.raises(OptionError, match="--model"):
        GeneratorConfig(users=1, days=1, seed=1, model="random")


def test_every_break_is_restored_or_still_open_at_the_end(tmp_path: Path) -> None:
    cfg = GeneratorConfig(users=10, days=2, seed=2, model="commute", **CLEAN)
    generate(cfg, tmp_path, parquet=False)
    state: dict[str, str] = defaultdict(lambda: "up")
    for raw in _lines(tmp_path):
        r = json.loads(raw)
        if r["event"] == "media_disconnected":
            assert state[r["uri"]] == "up"  # the generator never reports a break twice
            state[r["uri"]] = "down"
        elif r["event"] == "media_connected":
            state[r["uri"]] = "up"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"users": 0}, "--users"),
        ({"days": 0}, "--days"),
        ({"model": "teleport"}, "--model"),
    ],
)
def test_bad_options_are_refused(change: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"users": 1, "days": 1, "seed": 1}
    with pytest.raises(OptionError, match=message):
        GeneratorConfig(**{**base, **change})  # type: ignore[arg-type]
