"""The agent's states and their transitions, as one table (``docs/agent.md`` draws it).

:class:`~mdeci.agent.core.AgentCore` changes its state only through :func:`next_state`:
every change is a :class:`Trigger` (what the core decided after an input) looked up in
:data:`TRANSITIONS`. A pair missing from the table is a bug in the core and raises
:class:`~mdeci.agent.errors.TransitionError` instead of leaving the agent in a state
nobody planned for.

A trigger names the step, not the input that led to it: a back-off timer, a lost peer or
a BYE from the broker all start an attempt, which is ``REGISTER`` when the agent is not
registered and ``INVITE`` otherwise. The source states of a trigger are wide because
inputs overlap: the answer to a probe, for instance, may come after a BYE from the
broker started the next attempt, and then connects the session from ``INVITING``.
"""

from __future__ import annotations

from enum import StrEnum

from mdeci.agent.errors import TransitionError


class State(StrEnum):
    IDLE = "IDLE"
    REGISTERING = "REGISTERING"
    INVITING = "INVITING"
    PROBING = "PROBING"
    CONNECTED = "CONNECTED"
    MOVING = "MOVING"
    BACKOFF = "BACKOFF"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"


class Status(StrEnum):
    """The agent's view of its media session with the broker."""

    CONNECTED = "CONNECTED"
    DISCONNECTED = "DISCONNECTED"


class Trigger(StrEnum):
    """A step of the core that changes (or confirms) its state."""

    REGISTER = "register"  # an attempt starts with REGISTER
    INVITE = "invite"  # an attempt (re-)INVITEs the broker
    ANSWERED = "answered"  # the broker answered the INVITE: probe the media path
    RESUMED = "resumed"  # a re-INVITE answered while the media path is up
    PROBED = "probed"  # the probe's answer came: the media path is up
    FAILED = "failed"  # an attempt failed: wait a back-off
    MOVE = "move"  # our address changed: rebind, REGISTER there, re-INVITE
    CLOSE = "close"  # stop: BYE, unREGISTER
    CLOSED = "closed"  # the last step of stopping is done


S = State
T = Trigger

# Every state but the two of stopping.
ACTIVE = (S.IDLE, S.REGISTERING, S.INVITING, S.PROBING, S.CONNECTED, S.MOVING, S.BACKOFF)


Key = tuple[State, Trigger]


def _from(sources: tuple[State, ...], trigger: Trigger, target: State) -> dict[Key, State]:
    return {(source, trigger): target for source in sources}


# The states in which an INVITE may run: the one it was sent from, and those a probe's
# answer or failure may have led to meanwhile.
INVITE_RUNS = (S.INVITING, S.CONNECTED, S.MOVING, S.BACKOFF)
# The states in which a probe may be pending: it stays across a BYE's new attempt, a
# move, and a second session's probe.
PROBE_PENDS = (S.REGISTERING, S.INVITING, S.PROBING, S.CONNECTED, S.MOVING, S.BACKOFF)

TRANSITIONS: dict[Key, State] = {
    # An attempt starts when no SIP command runs: at start, after a back-off or a move,
    # or when the session is lost (peer lost, BYE from the broker).
    **_from((S.IDLE, S.PROBING, S.CONNECTED, S.MOVING, S.BACKOFF), T.REGISTER, S.REGISTERING),
    # ...and INVITEs when registered (REGISTERING: the REGISTER's 200; INVITING: a 481).
    **_from(
        (S.REGISTERING, S.INVITING, S.PROBING, S.CONNECTED, S.MOVING, S.BACKOFF),
        T.INVITE,
        S.INVITING,
    ),
    # The INVITE's answer: probe the media path, or resume at once when it is up.
    **_from(INVITE_RUNS, T.ANSWERED, S.PROBING),
    **_from(INVITE_RUNS, T.RESUMED, S.CONNECTED),
    **_from(PROBE_PENDS, T.PROBED, S.CONNECTED),
    # An attempt fails in any state once started: its SIP command, its probe (which
    # pends in the same states), or a state file.
    **_from(PROBE_PENDS, T.FAILED, S.BACKOFF),
    # A move starts when no SIP command runs (as an attempt), or after the REGISTER's 200.
    **_from((S.IDLE, S.REGISTERING, S.PROBING, S.CONNECTED, S.MOVING, S.BACKOFF), T.MOVE, S.MOVING),
    **_from(ACTIVE, T.CLOSE, S.CLOSING),
    (S.CLOSING, T.CLOSED): S.CLOSED,
}


def next_state(state: State, trigger: Trigger) -> State:
    """The state ``trigger`` leads to from ``state``. Raises :class:`TransitionError`
    when the table has no such transition."""
    try:
        return TRANSITIONS[(state, trigger)]
    except KeyError:
        raise TransitionError(f"no transition from {state} on {trigger}") from None
