"""SIP errors: one base class; parse errors carry a position, peer errors a status."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sip.message import Request, Response


class SipError(Exception):
    """Base class of every error raised by the ``sip`` package."""


class SipParseError(SipError):
    """Bytes that are not a valid SIP message (or header, URI, ...).

    ``position`` is the byte/character offset where parsing failed, ``reason``
    says why. ``message`` holds the partially parsed message when the method and
    headers could be read (so a UAS can still answer using its Via), ``status`` what a
    UAS answers (400; 505 for an unsupported SIP version).
    """

    def __init__(
        self,
        position: int,
        reason: str,
        message: Request | Response | None = None,
        *,
        status: int = 400,
    ) -> None:
        super().__init__(f"at {position}: {reason}")
        self.position = position
        self.reason = reason
        self.message = message
        self.status = status


class SdpError(SipError):
    """An SDP offer we cannot answer; the UAS answers ``status`` (488)."""

    status = 488

    def __init__(self, reason: str, status: int = 488) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class SipRequestFailed(SipError):
    """A request of ours was answered with a final non-2xx ``status`` (or timed out: 408)."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"{status} {reason}".strip())
        self.status = status
        self.reason = reason


class TransactionError(SipError):
    """A transaction was used in a way its state machine does not allow."""


class DialogError(SipError):
    """A request that does not fit the dialog; ``status`` is the answer (481, 491, 500)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


class AuthError(SipError):
    """Digest authentication could not go on (RFC 3261 §22); ``status`` is the answer."""

    status = 400

    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if status is not None:
            self.status = status


class AuthHeaderError(AuthError):
    """A malformed WWW-/Proxy-Authenticate or (Proxy-)Authorization value (answer 400).

    ``position`` is the character offset in the header value where parsing failed.
    """

    status = 400

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"at {position}: {reason}")
        self.position = position
        self.reason = reason


class AuthUnsupportedError(AuthError):
    """Client side: the server offered no challenge we can answer (scheme, algorithm, qop)."""

    status = 401


class AuthRejectedError(AuthError):
    """Client side: the server refused credentials we already sent (do not retry, §22.2)."""

    status = 401
