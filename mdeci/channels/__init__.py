"""Channel selection (pure): cost function, limits, delay tolerance.

See docs/channels.md. Everything here is a pure function or a value object, except the
counters behind :class:`UsageCounter`, which the caller supplies.
"""

from mdeci.channels.calendar import Rule, WeeklyCalendar
from mdeci.channels.cost import score
from mdeci.channels.errors import ChannelError, PolicyError, UnknownQueueClass
from mdeci.channels.limits import (
    CachedUsage,
    Limit,
    MemoryUsage,
    Period,
    Usage,
    UsageCounter,
    period_days,
)
from mdeci.channels.model import (
    CHEAPEST,
    Billing,
    Channel,
    ClassPolicy,
    Kind,
    Tariff,
    Weights,
    default_classes,
)
from mdeci.channels.selector import (
    Decision,
    Hold,
    HoldQueue,
    NoChannel,
    Outgoing,
    SelectorPolicy,
    SendNow,
    record_send,
    select,
)

__all__ = [
    "CHEAPEST",
    "Billing",
    "CachedUsage",
    "Channel",
    "ChannelError",
    "ClassPolicy",
    "Decision",
    "Hold",
    "HoldQueue",
    "Kind",
    "Limit",
    "MemoryUsage",
    "NoChannel",
    "Outgoing",
    "Period",
    "PolicyError",
    "Rule",
    "SelectorPolicy",
    "SendNow",
    "Tariff",
    "UnknownQueueClass",
    "Usage",
    "UsageCounter",
    "WeeklyCalendar",
    "Weights",
    "default_classes",
    "period_days",
    "record_send",
    "score",
    "select",
]
