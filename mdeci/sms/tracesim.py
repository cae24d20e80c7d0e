"""The SMS link's timers over the thesis' SMSC delay trace (sans-IO, seeded, fake clock).

Theory of operation. A broker link sends ``frames`` notifications to an agent link
through a :class:`~mdeci.sms.smsc.SimulatedSmsc` whose delays are the thesis' measured
histogram (:data:`~mdeci.sms.smsc.THESIS_DELAYS`: 73.2% < 10 s, 17% < 1 min, 5% > 1.5 h,
5.1% never), in both directions (acks are SMS too). Time is a number moved from one
event (delivery, timer) to the next; nothing sleeps. For each frame we record when the
agent first had it; for the run, how many SMS each side submitted, how many copies the
agent received beyond the first (duplicates), and the money the broker spent.

:func:`simulate` is what docs/benchmarks.md "SMS link timers" tabulates for initial ack
timeouts of 60 s and 200 s (``python -m mdeci.sms.tracesim`` prints the table).
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from mdeci.sms.config import SmsConfig
from mdeci.sms.link import BufferAcknowledged, BufferExpired, FrameReceived, SmsLink
from mdeci.sms.smsc import THESIS_DELAYS, SimulatedSmsc, SmscConfig

BROKER, AGENT = "+15550000001", "+15550000002"
#: Bounds of the table's delivery columns, seconds (the trace's own bins).
BOUNDS = (10.0, 60.0, 5400.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceRun:
    """One simulated run: ``frames`` frames of ``frame_bytes`` octets, ``spacing`` s apart."""

    link: SmsConfig
    frames: int = 2000
    frame_bytes: int = 100  # 100: one SMS; 300: three
    # One urgent SMS notification per user every 10 minutes. Much faster (every 30 s)
    # wraps the 8-bit references within the trace's 3-hour tail: late copies of an old
    # buffer then meet a new one with the same reference and spoil it; ref16 avoids it.
    spacing: float = 600.0
    ttl: float = 24 * 3600.0
    price: float = 0.0015  # per MT SMS (the broker's bill)
    seed: int = 1


@dataclass(frozen=True, slots=True)
class TraceResult:
    """Shares of frames the agent had within each of :data:`BOUNDS`, later, never."""

    within: tuple[float, ...]  # cumulative share delivered within each bound
    later: float  # delivered after the last bound (within the TTL)
    never: float  # not delivered within the TTL
    mt_sms: int  # SMS the broker submitted
    mo_sms: int  # SMS the agent submitted (acks)
    min_mt_sms: int  # what the frames need without any resend
    duplicates: int  # copies of completed buffers the agent received again
    cost: float  # broker's money: mt_sms * price
    median_s: float  # median delivery time of delivered frames


def simulate(run: TraceRun) -> TraceResult:
    """Run ``run`` to its end (every buffer acked or expired, the SMSC empty)."""
    smsc = SimulatedSmsc(SmscConfig(delays=THESIS_DELAYS), random.Random(run.seed))
    broker, agent = SmsLink(BROKER, run.link), SmsLink(AGENT, run.link)
    first_had: dict[bytes, float] = {}
    sent_at: dict[bytes, float] = {}
    mt = mo = 0
    now = 0.0
    frames = [i.to_bytes(4, "big") + bytes(max(0, run.frame_bytes - 4)) for i in range(run.frames)]
    next_frame = 0

    def pump() -> None:
        nonlocal mt, mo
        for sms in broker.sms_to_send():
            mt += 1
            smsc.submit(sms, now)
        for sms in agent.sms_to_send():
            mo += 1
            smsc.submit(sms, now)
        while (ev := agent.next_event()) is not None:
            if isinstance(ev, FrameReceived):
                first_had.setdefault(ev.frame, now)
        while (ev := broker.next_event()) is not None:
            assert isinstance(ev, BufferAcknowledged | BufferExpired)

    while True:
        times = [
            t
            for t in (
                run.spacing * next_frame if next_frame < len(frames) else None,
                smsc.next_delivery(),
                broker.get_timer(),
                agent.get_timer() if broker.pending() else None,
            )
            if t is not None
        ]
        if not times:
            break
        now = max(now, min(times))
        while next_frame < len(frames) and run.spacing * next_frame <= now:
            frame = frames[next_frame]
            sent_at[frame] = now
            broker.send_frame(AGENT, frame, now, ttl=run.ttl)
            next_frame += 1
        for sms in smsc.deliver_due(now):
            (agent if sms.recipient == AGENT else broker).receive_sms(sms, now)
        for link in (broker, agent):
            timer = link.get_timer()
            if timer is not None and timer <= now:
                link.handle_timer(now)
        pump()

    delays = sorted(first_had[f] - sent_at[f] for f in frames if f in first_had)
    n = len(frames)
    within = tuple(sum(1 for d in delays if d < bound) / n for bound in BOUNDS)
    per_frame = math.ceil((run.frame_bytes + 4) / 128)
    return TraceResult(
        within=within,
        later=(len(delays) / n) - within[-1],
        never=1.0 - len(delays) / n,
        mt_sms=mt,
        mo_sms=mo,
        min_mt_sms=per_frame * n,
        duplicates=agent.stats.duplicates,
        cost=mt * run.price,
        median_s=delays[len(delays) // 2] if delays else math.inf,
    )


def table(timeouts: tuple[float, ...] = (60.0, 200.0), *, frames: int = 2000, seed: int = 1) -> str:
    """docs/benchmarks.md's table: one row per (frame size, first-part ack, timeout)."""
    rows = [
        "| frame | first part acked first | initial timeout | < 10 s | < 1 min | < 1.5 h "
        "| later | never (24 h TTL) | median | MT SMS per frame | duplicates per frame "
        "| cost per frame ($0.0015/SMS) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in (100, 300, 1000):
        for stepped in (False,) if size <= 124 else (False, True):
            for timeout in timeouts:
                link = SmsConfig(ack_timeout=timeout, first_part_ack=stepped)
                res = simulate(TraceRun(link=link, frames=frames, frame_bytes=size, seed=seed))
                segs = res.min_mt_sms // frames
                rows.append(
                    f"| {size} B ({segs} SMS) | {'yes' if stepped else 'no'} | {timeout:.0f} s "
                    + "".join(f"| {w:.1%} " for w in res.within)
                    + f"| {res.later:.1%} | {res.never:.2%} | {res.median_s:.1f} s "
                    f"| {res.mt_sms / frames:.2f} | {res.duplicates / frames:.2f} "
                    f"| ${res.cost / frames:.5f} |"
                )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(table(frames=args.frames, seed=args.seed))


if __name__ == "__main__":
    main()
