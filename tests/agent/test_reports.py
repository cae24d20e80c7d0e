"""What the agent core's events do outside it (mdeci.agent.reports), without a loop: a
real churn log on a fake clock, standard-library futures for requests, lists for
listeners."""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.errors import BrokerRefused, NotConnected
from mdeci.agent.events import (
    ChurnRecord,
    Delivered,
    RequestDone,
    RequestFailed,
    StateChanged,
    SubscriptionChanged,
)
from mdeci.agent.machine import State, Status
from mdeci.agent.reports import Reports
from mdeci.churnlog import ChurnLog, Event
from mdeci.frames import Frame, SubOk

AOR = "sip:alice@example.org"


class Listener:
    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []

    def put_nowait(self, item: dict[str, Any], /) -> None:
        self.got.append(item)


def _reports(errors: list[str]) -> Reports[Future[Frame], Listener]:
    return Reports(AOR, errors.append)


def test_churn_records_are_written_counted_and_kept(tmp_path: Path) -> None:
    errors: list[str] = []
    reports = _reports(errors)
    reports.churn = log = ChurnLog(tmp_path / "churn.log", "node1", lambda: 1000.0)
    reports.handle(ChurnRecord(Event.NOTIFY_DELIVERED, {"nseq": 3, "channel": None}))
    log.close()
    (line,) = (tmp_path / "churn.log").read_text().splitlines()
    written = json.loads(line)
    assert written["event"] == "notify_delivered" and written["uri"] == AOR
    assert "channel" not in written  # unset fields are left out
    assert reports.counts["notify_delivered"] == 1 and list(reports.recent) == [written]
    # A log that cannot be written is the core's last error; the record still counts.
    reports.handle(ChurnRecord(Event.NOTIFY_DELIVERED, {"nseq": 4}))
    assert len(errors) == 1 and reports.counts["notify_delivered"] == 2
    assert reports.recent[-1] == {"event": "notify_delivered", "uri": AOR, "nseq": 4}


def test_requests_complete_with_their_answer_or_error_and_fail_on_close() -> None:
    reports = _reports([])
    done, failed, pending = Future[Frame](), Future[Frame](), Future[Frame]()
    reports.requests.update({1: done, 2: failed, 3: pending})
    answer = SubOk(req=1, sub_id="7", expires_at=10.0)
    reports.handle(RequestDone(1, answer))
    reports.handle(RequestFailed(2, BrokerRefused(403, "forbidden")))
    reports.handle(RequestDone(9, answer))  # nobody waits for it any more: nothing happens
    assert done.result() == answer
    assert isinstance(failed.exception(), BrokerRefused)
    assert list(reports.requests) == [3]
    reports.close()
    assert isinstance(pending.exception(), NotConnected)


def test_listeners_hear_deliveries_and_subscription_changes() -> None:
    reports = _reports([])
    first, second = Listener(), Listener()
    reports.listeners.update({first, second})
    reports.handle(Delivered({"nseq": 5}))
    change = SubscriptionChanged(
        sub_id="7", state="ended", reason="expired", subject="s", filter="", expires_at=0.0,
        lease=False,
    )  # fmt: skip
    reports.handle(change)
    for listener in (first, second):
        assert listener.got == [{"nseq": 5}, {"subscription": change.to_json()}]
    assert first.got[1] is not second.got[1]  # each its own record of the change


@pytest.mark.parametrize(
    ("status", "connected"), [(Status.CONNECTED, True), (Status.DISCONNECTED, False)]
)
def test_a_state_change_says_whether_the_agent_is_connected(
    status: Status, connected: bool
) -> None:
    reports = _reports([])
    assert reports.handle(StateChanged(State.CONNECTED, status)) is connected
    assert reports.handle(Delivered({})) is None
