"""Interop with sipp (Debian ``sip-tester``): the scenario files are in ``scenarios/``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sip.aio.ua import UaConfig, UserAgent
from sip.errors import SipRequestFailed
from sip.transaction import TimerConfig
from tests.sip.interop.sippctl import SCENARIOS, Sipp, SippResult
from tests.sip.interop.tools import Tool

pytestmark = pytest.mark.peer("sipp")

OFFER = (
    "v=0\r\no=alice 1 1 IN IP4 127.0.0.2\r\ns=mdeci\r\nc=IN IP4 127.0.0.2\r\nt=0 0\r\n"
    "m=application 42000 UDP/MDECI-RUDP mdeci\r\na=mdeci-version:2\r\n"
    "a=mdeci-kx:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8\r\na=sendrecv\r\n"
)


async def test_our_uac_against_sipp_uas(tmp_path: Path) -> None:
    """(c) INVITE with our SDP, ACK, re-INVITE with a new c= address, BYE; sipp verifies."""
    sipp = Sipp(["-sf", str(SCENARIOS / "uas_mdeci.xml"), "-m", "1"], tmp_path)
    ua = UserAgent(UaConfig(aor="sip:alice@example.org", timers=TimerConfig(t1=0.1)))
    await ua.start("127.0.0.2")
    try:
        dialog, response = await ua.invite(
            "sip:sipp@127.0.0.1", ("127.0.0.1", sipp.port), OFFER.encode()
        )
        assert response.status == 200
        assert b"UDP/MDECI-RUDP" in response.body
        moved = OFFER.replace("127.0.0.2", "127.0.0.3").replace(" 1 1 IN", " 1 2 IN")
        re = await ua.reinvite(dialog, moved.encode())
        assert re.status == 200
        assert (await ua.bye(dialog)).status == 200
        result = await asyncio.get_running_loop().run_in_executor(None, sipp.wait, 30)
        assert result.returncode == 0, result.output
        assert (result.successful, result.failed) == (1, 0), result.output
    finally:
        sipp.stop()
        await ua.close()


async def test_our_uac_answers_sipp_digest_challenge(tmp_path: Path) -> None:
    """(d, sipp challenges us) REGISTER, 401 MD5/qop=auth, our answer passes verifyauth."""
    sipp = Sipp(["-sf", str(SCENARIOS / "uas_auth.xml"), "-m", "1"], tmp_path)
    ua = UserAgent(
        UaConfig(aor="sip:alice@example.org", password="s3cret", timers=TimerConfig(t1=0.1))
    )
    await ua.start("127.0.0.2")
    try:
        response = await ua.register(("127.0.0.1", sipp.port), 600)
        assert response.status == 200
        assert ua.registered_for == 600
        result = await asyncio.get_running_loop().run_in_executor(None, sipp.wait, 30)
        assert result.returncode == 0, result.output
    finally:
        sipp.stop()
        await ua.close()


async def test_wrong_password_is_refused_by_sipp(tmp_path: Path) -> None:
    sipp = Sipp(["-sf", str(SCENARIOS / "uas_auth.xml"), "-m", "1"], tmp_path)
    ua = UserAgent(
        UaConfig(aor="sip:alice@example.org", password="wrong", timers=TimerConfig(t1=0.1))
    )
    await ua.start("127.0.0.2")
    try:
        with pytest.raises(SipRequestFailed) as info:
            await ua.register(("127.0.0.1", sipp.port), 600)
        assert info.value.status == 403
    finally:
        sipp.stop()
        await ua.close()


def test_sipp_uac_against_our_uas(tmp_path: Path) -> None:
    """(b) sipp: INVITE with our SDP, ACK, re-INVITE with a new c= address, BYE."""
    uas = Tool("uas", "--listen", "127.0.0.1:0")
    try:
        host, port = uas.addr
        sipp = Sipp(
            ["-sf", str(SCENARIOS / "uac_mdeci.xml"), "-m", "1", "-s", "broker",
             f"{host}:{port}"],
            tmp_path,
        )  # fmt: skip
        result = sipp.wait(30)
        assert result.returncode == 0, result.output
        assert (result.successful, result.failed) == (1, 0), result.output
        assert "media=127.0.0.1:41000 version=1" in uas.expect(r"^offer ")
        assert "media=127.0.0.3:41002 version=2" in uas.expect(r"^offer ")
        uas.expect(r"^refreshed ")
        uas.expect(r"^ended .*bye received")
    finally:
        uas.stop()


def test_5000_registers_at_500_per_second(tmp_path: Path) -> None:
    """(a) 5,000 REGISTERs at 500/s from sipp to our registrar, none failed."""
    registrar = Tool("registrar", "--listen", "127.0.0.1:0", "--quiet")
    try:
        host, port = registrar.addr
        sipp = Sipp(
            ["-sf", str(SCENARIOS / "uac_register.xml"), "-r", "500", "-m", "5000",
             "-l", "1000", f"{host}:{port}"],
            tmp_path,
        )  # fmt: skip
        result = sipp.wait(120)
        assert result.returncode == 0, result.output
        assert (result.successful, result.failed) == (5000, 0), result.output
    finally:
        registrar.stop()


def _sipp_registers_with_digest(tmp_path: Path, registrar_password: str) -> tuple[Tool, SippResult]:
    """sipp (password s3cret) REGISTERs alice at our registrar, which challenges (MD5)
    with ``registrar_password`` on file; returns the still-running registrar and sipp's
    verdict. The caller stops the registrar."""
    users = tmp_path / "users.txt"
    users.write_text(f"alice {registrar_password}\n")
    registrar = Tool(
        "registrar", "--listen", "127.0.0.1:0", "--users", str(users), "--algorithm", "MD5"
    )
    try:
        host, port = registrar.addr
        sipp = Sipp(
            ["-sf", str(SCENARIOS / "uac_register_auth.xml"), "-m", "1",
             "-auth_uri", "example.org", f"{host}:{port}"],
            tmp_path,
        )  # fmt: skip
        return registrar, sipp.wait(30)
    except BaseException:
        registrar.stop()
        raise


def test_sipp_answers_our_digest_challenge(tmp_path: Path) -> None:
    """(d, we challenge sipp) our registrar sends 401 (MD5), sipp answers, we accept."""
    registrar, result = _sipp_registers_with_digest(tmp_path, "s3cret")
    try:
        assert result.returncode == 0, result.output
        assert (result.successful, result.failed) == (1, 0), result.output
        assert "registered sip:alice@example.org" in registrar.expect(r"registered ")
    finally:
        registrar.stop()


def test_sipp_with_wrong_password_is_refused(tmp_path: Path) -> None:
    registrar, result = _sipp_registers_with_digest(tmp_path, "another-password")
    try:
        assert result.returncode != 0 and result.failed == 1, result.output
        assert not [line for line in registrar.seen if line.startswith("registered")]
    finally:
        registrar.stop()
