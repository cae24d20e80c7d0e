"""sipp against our UAS (`python -m sip uas`): the RFC 3261 answers of the UAS core:
OPTIONS with an honest Allow, 501 for an unknown method, 405 + Allow for a known one we
do not serve, and CANCEL of a pending INVITE (200, then 487)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sip.interop.sippctl import SCENARIOS, Sipp
from tests.sip.interop.tools import Tool


def run_scenario(tmp_path: Path, scenario: str, *uas_args: str) -> Tool:
    uas = Tool("uas", "--listen", "127.0.0.1:0", *uas_args)
    try:
        host, port = uas.addr
        sipp = Sipp(
            ["-sf", str(SCENARIOS / scenario), "-m", "1", "-s", "broker", f"{host}:{port}"],
            tmp_path,
        )
        result = sipp.wait(30)
        assert result.returncode == 0, result.output
        assert (result.successful, result.failed) == (1, 0), result.output
    finally:
        uas.stop()
    return uas


@pytest.mark.parametrize("scenario", ["uac_options.xml", "uac_unknown_method.xml"])
def test_sipp_rfc_answers(tmp_path: Path, scenario: str) -> None:
    run_scenario(tmp_path, scenario)


def test_sipp_cancel_of_a_pending_invite(tmp_path: Path) -> None:
    # The UAS waits 5 s before answering: the CANCEL (sent right after the 100) finds the
    # INVITE pending; the scenario fails on anything but 200 to CANCEL, then 487.
    run_scenario(tmp_path, "uac_cancel.xml", "--answer-delay", "5")
