"""``mdeci demo --quick`` end to end: the verdict, the summary file and the churn logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mdeci.cli import main
from mdeci.demo.plan import QUICK, DemoPlan
from mdeci.demo.summary import Delivered, Published, judge

# Every step of the story leaves its mark in one of the three churn logs.
EXPECTED_EVENTS = {
    "registered",
    "session_started",
    "session_reinvited",
    "ip_changed",
    "media_connected",
    "media_disconnected",
    "subscription_added",
    "notify_queued",
    "notify_delivered",
    "session_ended",
    "unregistered",
}


def _records(folder: Path) -> list[dict[str, object]]:
    records = []
    for path in sorted(folder.glob("*.log")):
        for line in path.read_text().splitlines():
            records.append(json.loads(line))  # every line is one JSON object
    return records


def test_quick_demo_loses_and_duplicates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--plain", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "result         OK" in printed
    assert str(out / "logs") in printed

    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] is True
    assert summary["published"] == QUICK.events
    assert summary["matched"] > 0
    assert summary["delivered"] == summary["matched"] == summary["broker_matched"]
    assert (summary["lost"], summary["duplicated"], summary["out_of_order"]) == (0, 0, 0)
    assert summary["handovers"] == len(QUICK.moves_at) + 1
    outage = summary["outage"]
    assert outage["detected_after_s"] is not None
    assert outage["detected_after_s"] < QUICK.outage_for
    assert outage["queued"] > 0 and outage["drained_in_s"] is not None

    records = _records(out / "logs")
    assert {r["node"] for r in records} == {"broker-1", "alice-phone", "bob-phone"}
    assert {str(r["event"]) for r in records} >= EXPECTED_EVENTS
    # alice's phone handed over each matching quote once.
    delivered = [
        r for r in records if r["node"] == "alice-phone" and r["event"] == "notify_delivered"
    ]
    assert len(delivered) == summary["matched"]
    moved_to = [str(r["addr"]).split(":")[0] for r in records if r["event"] == "ip_changed"]
    assert moved_to == list(QUICK.hosts[1:])
    # Every move ends in a restore event that says how long it took (docs/protocol.md §8).
    restores = [
        r
        for r in records
        if r["node"] == "alice-phone" and r["event"] == "media_connected" and "latency_ms" in r
    ]
    assert len(restores) >= len(moved_to)
    assert all(0 <= float(str(r["latency_ms"])) < 10_000 for r in restores)


def test_the_demo_refuses_to_wipe_a_folder_it_did_not_make(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    assert main(["demo", "--quick", "--plain", "--out", str(tmp_path)]) == 2
    assert "not made by the demo" in capsys.readouterr().err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_judge_counts_lost_duplicated_reordered_and_unexpected() -> None:
    published = [Published(i, f"m{i}", expected=i != 3) for i in range(5)]
    delivered = [
        Delivered("m0", 1, 0.0),
        Delivered("m2", 3, 0.1),
        Delivered("m1", 2, 0.2),  # published before m2, handed over after it
        Delivered("m2", 3, 0.3),  # again
        Delivered("m3", 4, 0.4),  # the filter said no
    ]
    counts = judge(published, delivered)
    assert (counts.lost, counts.duplicated, counts.out_of_order, counts.unexpected) == (1, 1, 1, 1)


def test_a_plan_must_be_in_order() -> None:
    with pytest.raises(ValueError, match="in order"):
        DemoPlan(moves_at=(3.0, 2.0))
    with pytest.raises(ValueError, match="one host per move"):
        DemoPlan(hosts=("127.0.0.2", "127.0.0.3"))
