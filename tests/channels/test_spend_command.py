"""``mdeci sms spend``: the operator's view of per-user channel spend."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from mdeci.channels.limits import Usage
from mdeci.cli import main
from mdeci.store.base import make_engine
from mdeci.store.migrate import upgrade
from mdeci.store.usage import SqlUsage


def test_spend_lists_each_users_channel_totals_for_the_month(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'broker.db'}"
    upgrade(url)
    engine = make_engine(url)
    try:
        usage = SqlUsage(engine)
        at = dt.datetime(2026, 11, 3, 12, tzinfo=dt.UTC).timestamp()
        usage.add("sip:alice@example.org", "sms", "urgent", at, Usage(2, 280, 0.003))
        usage.add("sip:alice@example.org", "sms", "urgent", at + 86400, Usage(1, 140, 0.0015))
        usage.add("sip:bob@example.org", "sms", "urgent", at, Usage(1, 140, 0.0015))
        later = dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp()
        usage.add("sip:alice@example.org", "sms", "urgent", later, Usage(5, 700, 0.0075))
    finally:
        engine.dispose()

    assert main(["sms", "spend", "--url", url, "--month", "2026-11"]) == 0
    out = capsys.readouterr().out
    alice = next(line for line in out.splitlines() if "alice" in line)
    assert " 3 " in alice and "420" in alice and "0.0045" in alice  # December not counted
    assert "bob" in out

    assert main(["sms", "spend", "--url", url, "--month", "2026-11", "--user",
                 "sip:bob@example.org"]) == 0  # fmt: skip
    assert "alice" not in capsys.readouterr().out


def test_spend_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}"
    assert main(["sms", "spend", "--url", missing]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mdeci sms: error:" in err
    with pytest.raises(SystemExit):
        main(["sms", "spend", "--url", missing, "--month", "2026-13"])
