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
from mdeci.channels.networks import (
    Best,
    BySms,
    Deliver,
    DeviceReport,
    Network,
    NetworkDecision,
    Queue,
    Wait,
    decide,
    network_policy,
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
    "Best",
    "Billing",
    "BySms",
    "CachedUsage",
    "Channel",
    "ChannelError",
    "ClassPolicy",
    "Decision",
    "Deliver",
    "DeviceReport",
    "Hold",
    "HoldQueue",
    "Kind",
    "Limit",
    "MemoryUsage",
    "Network",
    "NetworkDecision",
    "NoChannel",
    "Outgoing",
    "Period",
    "PolicyError",
    "Queue",
    "Rule",
    "SelectorPolicy",
    "SendNow",
    "Tariff",
    "UnknownQueueClass",
    "Usage",
    "UsageCounter",
    "Wait",
    "WeeklyCalendar",
    "Weights",
    "decide",
    "default_classes",
    "network_policy",
    "period_days",
    "record_send",
    "score",
    "select",
]
