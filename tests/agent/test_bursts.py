"""The agent records a burst of notifications with one fsync and acks it only after that:
AgentCore on real files in ``tmp_path``, with a counting fsync."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mdeci.agent.events import Alert, Delivered, RequestFailed
from mdeci.agent.intake import RETRY_WRITE
from mdeci.agent.state import INBOX_FILE, NSEQ_FILE, OUTBOX_FILE, Outbox
from mdeci.frames import Ack, Pub, PubOk, encode
from mdeci.sms.dedupe import NseqGate
from tests.agent.test_core import Rig, open_files


class Crash(Exception):
    """The process dies inside fsync: nothing after it runs."""


class Syncs:
    """A real ``os.fsync`` that counts its calls, notes how many notifications were
    handed over when each came, and can fail (``OSError``) or "crash" instead."""

    def __init__(self) -> None:
        self.calls = 0
        self.delivered_at: list[int] = []
        self.rig: Rig | None = None
        self.fail: BaseException | None = None

    def __call__(self, fd: int) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls += 1
        if self.rig is not None:
            self.delivered_at.append(delivered(self.rig))
        os.fsync(fd)


def delivered(rig: Rig) -> int:
    return sum(isinstance(e, Delivered) for e in rig.events)


def nseqs_in_inbox(state: Path) -> list[int]:
    lines = (state / INBOX_FILE).read_text().splitlines()
    return [int(json.loads(line)["nseq"]) for line in lines if line]


def connected(state: Path, syncs: Syncs) -> Rig:
    rig = Rig(state, syncs)
    rig.connect()
    rig.commands()
    syncs.calls, syncs.rig, syncs.delivered_at = 0, rig, []
    return rig


def test_a_burst_is_recorded_with_one_fsync_then_handed_over_and_acked_once(
    tmp_path: Path,
) -> None:
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    rig.core.frames_received(rig.now, [rig.notify_frame(n) for n in range(1, 6)])
    assert syncs.calls == 1  # the inbox append; nseq.json (window 0) is a checkpoint
    assert syncs.delivered_at == [0]  # durable before anything is handed over
    assert [e.record["nseq"] for e in rig.events if isinstance(e, Delivered)] == [1, 2, 3, 4, 5]
    assert rig.frames(rig.commands()) == [Ack(upto=5)]
    assert nseqs_in_inbox(tmp_path) == [1, 2, 3, 4, 5]
    assert open_files(tmp_path).nseq.highest == 5  # what a restart takes

    # A burst of copies only (the broker resent after a move): acked, nothing written.
    rig.core.frames_received(rig.now, [rig.notify_frame(n) for n in (4, 5)])
    assert syncs.calls == 1 and delivered(rig) == 5
    assert rig.frames(rig.commands()) == [Ack(upto=5)]
    # One notification at a time still costs one fsync each.
    for n in (6, 7):
        assert rig.frames(rig.notify(n)) == [Ack(upto=n)]
    assert syncs.calls == 3


def test_a_frame_in_the_middle_of_a_burst_keeps_the_order(tmp_path: Path) -> None:
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    _, req = rig.core.publish(rig.now, "news.b", payload=b"p")
    assert req is not None
    rig.core.sync_outbox(rig.now)  # the outbox add: 1 fsync
    rig.commands()
    pub_ok = encode(PubOk(req=req, msg_id=rig.files.outbox.pending()[0].msg_id, matched=1))
    rig.core.frames_received(rig.now, [rig.notify_frame(1), pub_ok, rig.notify_frame(2)])
    # notify 1 recorded and acked before the pub-ok is taken; notify 2 after it. The
    # outbox's "done" is not fsync-ed (a lost one only resends with the same msg_id).
    assert syncs.calls == 1 + 2
    assert rig.frames(rig.commands()) == [Ack(upto=1), Ack(upto=2)]
    assert len(rig.files.outbox) == 0


def test_a_failed_write_hands_over_nothing_acks_nothing_and_takes_the_resend(
    tmp_path: Path,
) -> None:
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    burst = [rig.notify_frame(n) for n in (1, 2, 3)]
    syncs.fail = OSError(5, "Input/output error")
    rig.core.frames_received(rig.now, burst)
    assert rig.frames(rig.commands()) == [] and delivered(rig) == 0
    assert [e.kind for e in rig.events if isinstance(e, Alert)] == ["state"]
    assert nseqs_in_inbox(tmp_path) == []  # the lines written were taken back
    rig.core.frames_received(rig.now, burst)  # and again at each failure
    assert nseqs_in_inbox(tmp_path) == [] and delivered(rig) == 0

    # The broker sends them again (no ack came): taken once, now that the disk works.
    syncs.fail = None
    rig.core.frames_received(rig.now, burst)
    assert rig.frames(rig.commands()) == [Ack(upto=3)]
    assert [e.record["nseq"] for e in rig.events if isinstance(e, Delivered)] == [1, 2, 3]
    assert nseqs_in_inbox(tmp_path) == [1, 2, 3]


def test_a_burst_the_disk_refused_is_written_again_on_a_timer_without_a_resend(
    tmp_path: Path,
) -> None:
    """The broker sends an unacked notification again only to a new session: the agent
    writes what it could not record again itself, once the disk takes it."""
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    syncs.fail = OSError(28, "No space left on device")
    rig.core.frames_received(rig.now, [rig.notify_frame(n) for n in (1, 2, 3)])
    assert rig.frames(rig.commands()) == [] and delivered(rig) == 0
    retry_at = rig.core.get_timer()
    assert retry_at is not None and rig.now < retry_at <= rig.now + RETRY_WRITE
    rig.now = retry_at
    rig.core.handle_timer(rig.now)  # still full: nothing, and another attempt later
    assert rig.frames(rig.commands()) == [] and delivered(rig) == 0
    assert [e.kind for e in rig.events if isinstance(e, Alert)] == ["state"]  # not again
    retry_at = rig.core.get_timer()
    assert retry_at is not None and retry_at > rig.now

    syncs.fail = None  # the operator freed space
    rig.core.handle_timer(rig.now)  # not yet due: no write
    assert syncs.calls == 0
    rig.now = retry_at
    rig.core.handle_timer(rig.now)
    assert rig.frames(rig.commands()) == [Ack(upto=3)]
    assert [e.record["nseq"] for e in rig.events if isinstance(e, Delivered)] == [1, 2, 3]
    assert nseqs_in_inbox(tmp_path) == [1, 2, 3]
    assert rig.core.get_timer() is None  # nothing left to write
    rig.core.frames_received(rig.now, [rig.notify_frame(n) for n in (2, 3)])  # late copies
    assert rig.frames(rig.commands()) == [Ack(upto=3)] and delivered(rig) == 3


def test_a_later_burst_acks_nothing_the_disk_refused_before_it_is_recorded(
    tmp_path: Path,
) -> None:
    """The ack is cumulative: the burst after a failed write records the failed one's
    notifications first, and its ack covers only what is recorded."""
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    syncs.fail = OSError(28, "No space left on device")
    rig.core.frames_received(rig.now, [rig.notify_frame(n) for n in (1, 2)])
    syncs.fail = None
    rig.core.frames_received(rig.now, [rig.notify_frame(3)])
    assert rig.frames(rig.commands()) == [Ack(upto=3)]
    assert [e.record["nseq"] for e in rig.events if isinstance(e, Delivered)] == [1, 2, 3]
    assert nseqs_in_inbox(tmp_path) == [1, 2, 3]


@pytest.mark.parametrize("written", [True, False], ids=["lines-kept", "lines-lost"])
def test_a_crash_between_receipt_and_fsync_loses_nothing_and_duplicates_nothing(
    tmp_path: Path, written: bool
) -> None:
    """The process dies in the burst's fsync: no ack went out, so the broker sends the
    burst again to the restarted agent. Whether the lines written before the crash
    survived (a process crash: in the page cache) or not (a power cut), each
    notification is in the inbox exactly once, and the restarted agent acks them all."""
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    rig.core.frames_received(rig.now, [rig.notify_frame(1)])
    rig.commands()
    burst = [rig.notify_frame(n) for n in (2, 3, 4)]
    syncs.fail = Crash()
    with pytest.raises(Crash):
        rig.core.frames_received(rig.now, burst)
    assert rig.frames(rig.commands()) == []  # no ack before the fsync
    assert delivered(rig) == 1
    if not written:  # the power cut took what was not fsync-ed
        kept = (tmp_path / INBOX_FILE).read_text().splitlines()[:1]
        (tmp_path / INBOX_FILE).write_text("".join(line + "\n" for line in kept))

    again = connected(tmp_path, Syncs())  # the same state_dir, files opened afresh
    again.core.frames_received(again.now, [again.notify_frame(n) for n in (1, 2, 3, 4)])
    assert again.frames(again.commands()) == [Ack(upto=4)]
    assert nseqs_in_inbox(tmp_path) == [1, 2, 3, 4]
    handed = [e.record["nseq"] for e in again.events if isinstance(e, Delivered)]
    assert handed == ([] if written else [2, 3, 4])  # the kept lines were handed over


def test_a_windowed_gate_is_saved_with_each_burst_and_not_when_unchanged(
    tmp_path: Path,
) -> None:
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    rig.files.nseq.gate = NseqGate(0, window=8)  # as [sms] enabled builds it
    rig.core.frames_received(rig.now, [rig.notify_frame(n) for n in (1, 3, 2)])
    # inbox append, then nseq.json: temporary file and its folder.
    assert syncs.calls == 3
    saved = json.loads((tmp_path / NSEQ_FILE).read_text())
    assert (saved["highest"], saved["recent"]) == (3, [1, 2, 3])
    rig.core.frames_received(rig.now, [rig.notify_frame(2)])  # a copy: nothing changes
    assert syncs.calls == 3
    rig.files.nseq.save()  # unchanged: not written again
    assert syncs.calls == 3


def test_the_publishes_of_one_loop_turn_are_made_durable_with_one_fsync_then_sent(
    tmp_path: Path,
) -> None:
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    ids = [rig.core.publish(rig.now, "news.b", payload=f"p{i}".encode())[0] for i in range(3)]
    # Written, not durable yet: nothing on the wire.
    assert syncs.calls == 0 and rig.frames(rig.commands()) == []
    rig.core.sync_outbox(rig.now)
    assert syncs.calls == 1
    sent = rig.frames(rig.commands())
    assert [f.msg_id for f in sent if isinstance(f, Pub)] == ids
    rig.core.frames_received(
        rig.now,
        [encode(PubOk(req=f.req, msg_id=f.msg_id, matched=1)) for f in sent if isinstance(f, Pub)],
    )
    assert syncs.calls == 1 and len(rig.files.outbox) == 0  # "done" lines: no fsync
    rig.core.sync_outbox(rig.now)  # nothing new: no fsync
    assert syncs.calls == 1
    assert len(Outbox(tmp_path / OUTBOX_FILE)) == 0  # what a restart finds


def test_a_publish_answered_before_its_sync_is_made_durable_first(tmp_path: Path) -> None:
    """The connection drops before the loop turn's sync: the application hears
    "buffered" (RequestFailed) only once the publish is durable; it goes after the next
    connection."""
    syncs = Syncs()
    rig = connected(tmp_path, syncs)
    msg_id, req = rig.core.publish(rig.now, "news.b", payload=b"p")
    rig.core.peer_lost(rig.now, "rudp: test")
    assert syncs.calls == 1
    assert [e.req for e in rig.events if isinstance(e, RequestFailed)] == [req]
    assert [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)] == []
    rig.core.sync_outbox(rig.now)  # the glue's turn comes: nothing left to send
    assert [f for f in rig.frames(rig.commands()) if isinstance(f, Pub)] == []
    assert [p.msg_id for p in Outbox(tmp_path / OUTBOX_FILE).pending()] == [msg_id]
