"""The SIP backends and data channels the end-to-end suites run with: each suite runs on
both agent stacks, and the delivery stories on both data channels (docs/sip.md)."""

from __future__ import annotations

import pytest

from tests.peers import missing

STACKS = ("mdeci", "pjsua2")
TRANSPORTS = ("rudp", "quic")


@pytest.fixture(params=STACKS)
def sip_stack(request: pytest.FixtureRequest) -> str:
    """The agent's ``[sip] stack``; pjsua2 needs its binding (a real peer)."""
    stack = str(request.param)
    if stack == "pjsua2":
        try:
            import pjsua2  # noqa: F401
        except ImportError:
            missing("pjsua2 (PJSIP Python binding)", "pip install pjsua2-python")
    return stack


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """The data channel: the agents' ``[media] transport`` and the broker's only one."""
    return str(request.param)
