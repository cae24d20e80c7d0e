"""Reading a generated log back into each user's stints, and the Kolmogorov-Smirnov test.

The model tests judge a generator by its log, as a reader of a real log would: a stint
opens at a ``session_started`` or an agent's ``ip_changed`` and closes at the next move,
``media_disconnected`` or ``session_ended``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

OPENS = ("session_started", "ip_changed")
CLOSES = ("media_disconnected", "session_ended")


@dataclass(frozen=True, slots=True)
class Stint:
    """Connected on ``prefix`` (an address's first three octets) from ``start`` to ``end``
    (epoch ms)."""

    start: int
    end: int
    prefix: str

    @property
    def length(self) -> int:
        return self.end - self.start


def _ms(ts: str) -> int:
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).astimezone(UTC).timestamp() * 1000)


def stints(directory: Path) -> dict[str, list[Stint]]:
    """Every user's closed stints, in time order (a stint still open at the end is left
    out: its length is not known)."""
    lines: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for path in sorted(directory.glob("jsonl/*.jsonl")):
        for raw in path.read_text("utf-8").splitlines():
            r = json.loads(raw)
            event = r["event"]
            authority = "agent" if event == "ip_changed" else "broker"
            if event in (*OPENS, *CLOSES) and r.get("role", authority) == authority:
                lines[r["uri"]].append((_ms(r["ts"]), event, r.get("addr", "")))
    out: dict[str, list[Stint]] = {}
    for uri, events in lines.items():
        done: list[Stint] = []
        open_: tuple[int, str] | None = None
        for ts, event, addr in events:
            if open_ is not None:
                done.append(Stint(open_[0], ts, open_[1]))
                open_ = None
            if event in OPENS:
                open_ = (ts, addr.rsplit(".", 1)[0])
        out[uri] = done
    return out


def ks_p_value(sample: Sequence[float], cdf: Callable[[float], float]) -> float:
    """The p-value of the one-sample Kolmogorov-Smirnov test of ``sample`` against the
    continuous distribution ``cdf`` (Stephens' approximation of the statistic's law)."""
    xs = sorted(sample)
    n = len(xs)
    d = max(max((i + 1) / n - cdf(x), cdf(x) - i / n) for i, x in enumerate(xs))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p: float = 2 * sum(
        float((-1) ** (k - 1)) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101)
    )
    return min(1.0, max(0.0, p))


def uniform_cdf(lo: float, hi: float) -> Callable[[float], float]:
    return lambda x: min(1.0, max(0.0, (x - lo) / (hi - lo)))


def exponential_cdf(mean: float) -> Callable[[float], float]:
    return lambda x: 1.0 - math.exp(-max(0.0, x) / mean)
