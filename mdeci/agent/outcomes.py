"""What a failed SIP command means to the user: the alert the agent raises for it.

Decisions as values (as :mod:`sip.ua`): the core asks :func:`register_failure` or
:func:`invite_failure` and acts on the :class:`Failure` it gets (alert, count, back
off).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mdeci.agent.events import Invite, Register, Reinvite, SipCommand, SipOutcome
from mdeci.config import AgentConfig

NO_AUTHENTIC_ANSWER = (
    "no authentic answer from the broker after the key agreement: the SDP key "
    "exchange was altered on the path, the password differs, or the broker's media is "
    "unreachable"
)


@dataclass(slots=True)
class Counters:
    """What ``status`` shows about failures since start (never reset by a success)."""

    attempts: int = 0
    failed_attempts: int = 0
    auth_failures: int = 0
    requests_timed_out: int = 0
    store_replacements: int = 0
    alerts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Failure:
    """An alert of ``kind`` (see :class:`~mdeci.agent.events.Alert`) with ``message``;
    ``auth``: the credentials were refused (counted apart)."""

    kind: str
    message: str
    auth: bool = False


def register_failure(outcome: SipOutcome) -> Failure:
    """Why the registrar did not take our REGISTER."""
    status, reason = outcome.status, outcome.reason
    if status in (401, 403):
        return Failure(
            "auth",
            f"registrar refused our credentials ({status} {reason}): check aor and password",
            auth=True,
        )
    if status is None or status == 408:
        return Failure("unreachable", f"registrar unreachable: {reason}")
    return Failure("refused", f"REGISTER refused: {status} {reason}")


def invite_failure(command: Invite | Reinvite, outcome: SipOutcome) -> Failure:
    """Why the broker did not take our (re-)INVITE."""
    status, reason = outcome.status, outcome.reason
    if status in (401, 403):
        return Failure("auth", f"broker refused our credentials ({status})", auth=True)
    if status is None or status == 408:
        return Failure("unreachable", f"broker unreachable: {reason}")
    if status == 488:
        return Failure("key", f"broker refused our session offer: {reason}")
    return Failure("refused", f"{type(command).__name__.upper()} refused: {status} {reason}")


def no_answer_yet(busy: SipCommand, config: AgentConfig) -> Failure:
    """``busy`` got no answer within ``reconnect.warn_after``: SIP gives up only after
    64*T1 (32 s by default), so the user hears of it earlier (the attempt goes on)."""
    where = config.registrar if isinstance(busy, Register) else config.broker
    return Failure(
        "unreachable",
        f"no answer to {type(busy).__name__.upper()} from {where.address} "
        f"after {config.reconnect.warn_after:g} s (still trying)",
    )
