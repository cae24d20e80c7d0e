"""Judge a demo run: what bob published against what alice's application received.

Pure functions over the records the story collected, so the verdict can be tested on a
few hand-made rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Published:
    """One publish by bob: its position in the stream and whether the filter matches."""

    index: int
    msg_id: str
    expected: bool


@dataclass(frozen=True, slots=True)
class Delivered:
    """One notification handed to alice's application (monotonic seconds ``at``)."""

    msg_id: str
    nseq: int
    at: float


@dataclass(frozen=True, slots=True)
class Outage:
    """The disconnection episode. ``detected_after`` is None if the broker never noticed."""

    duration: float
    detected_after: float | None
    queued: int  # matching notifications waiting when alice came back
    drained_in: float | None  # seconds from the comeback until all of them arrived


@dataclass(frozen=True, slots=True)
class Summary:
    """The verdict: ``ok`` when nothing was lost, duplicated, reordered or unexpected."""

    published: int
    matched: int  # expected by evaluating the filter locally
    broker_matched: int  # the sum of bob's pub-ok 'matched'
    delivered: int
    lost: int
    duplicated: int
    out_of_order: int
    unexpected: int
    restore_ms: tuple[float, ...]  # per address change: move start -> first notification
    outage: Outage | None
    logs: Path
    elapsed: float

    @property
    def ok(self) -> bool:
        return self.lost == self.duplicated == self.out_of_order == self.unexpected == 0

    def to_json(self) -> dict[str, Any]:
        restore = self.restore_ms
        return {
            "ok": self.ok,
            "published": self.published,
            "matched": self.matched,
            "broker_matched": self.broker_matched,
            "delivered": self.delivered,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "unexpected": self.unexpected,
            "handovers": len(restore),
            "restore_ms": {
                "min": min(restore) if restore else None,
                "p50": statistics.median(restore) if restore else None,
                "max": max(restore) if restore else None,
                "all": list(restore),
            },
            "outage": None
            if self.outage is None
            else {
                "duration_s": self.outage.duration,
                "detected_after_s": self.outage.detected_after,
                "queued": self.outage.queued,
                "drained_in_s": self.outage.drained_in,
            },
            "logs": str(self.logs),
            "elapsed_s": self.elapsed,
        }


@dataclass(frozen=True, slots=True)
class Counts:
    lost: int
    duplicated: int
    out_of_order: int
    unexpected: int


def judge(published: Sequence[Published], delivered: Sequence[Delivered]) -> Counts:
    """Compare the stream with the deliveries.

    lost: expected and never delivered; duplicated: delivered more than once;
    out_of_order: handed over after a notification published later (or with a lower
    nseq); unexpected: delivered but not expected (a filter disagreement).
    """
    order = {p.msg_id: p.index for p in published}
    expected = {p.msg_id for p in published if p.expected}
    seen: set[str] = set()
    duplicated = out_of_order = 0
    last_index = last_nseq = -1
    for d in delivered:
        if d.msg_id in seen:
            duplicated += 1
            continue
        seen.add(d.msg_id)
        index = order.get(d.msg_id, -1)
        if index < last_index or d.nseq <= last_nseq:
            out_of_order += 1
        last_index = max(last_index, index)
        last_nseq = max(last_nseq, d.nseq)
    return Counts(
        lost=len(expected - seen),
        duplicated=duplicated,
        out_of_order=out_of_order,
        unexpected=len(seen - expected),
    )


def _ms(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return (
        f"min {min(values):.0f} ms / p50 {statistics.median(values):.0f} ms / "
        f"max {max(values):.0f} ms"
    )


def render(summary: Summary) -> list[str]:
    """The summary as the lines ``mdeci demo`` prints at the end."""
    s = summary
    rows = [
        ("published", f"{s.published} events by bob on {'StockExchange'}"),
        ("matched", f"{s.matched} expected by the filter (the broker counted {s.broker_matched})"),
        ("delivered", f"{s.delivered} to alice's application"),
        ("lost", str(s.lost)),
        ("duplicated", str(s.duplicated)),
        ("out of order", str(s.out_of_order)),
    ]
    if s.unexpected:
        rows.append(("unexpected", str(s.unexpected)))
    rows.append(
        (
            "handovers",
            f"{len(s.restore_ms)}: move to first notification {_ms(s.restore_ms)}",
        )
    )
    o = s.outage
    if o is not None:
        detected = "not detected" if o.detected_after is None else f"{o.detected_after:.1f} s"
        drained = "never" if o.drained_in is None else f"{o.drained_in:.2f} s"
        rows.append(
            (
                "disconnection",
                f"radio off {o.duration:.1f} s: broker detected it after {detected}; "
                f"drained {o.queued} queued in {drained}",
            )
        )
    rows.append(("churn logs", str(s.logs)))
    rows.append(("elapsed", f"{s.elapsed:.1f} s"))
    rows.append(("result", "OK" if s.ok else "FAILED"))
    return ["mdeci demo summary", *(f"  {k:<14} {v}" for k, v in rows)]
