"""Typed configuration of the broker and the agent, loaded once from TOML at start.

Theory of operation
-------------------
Each TOML file maps 1:1 onto frozen, keyword-only dataclasses: top-level keys are the
fields of :class:`BrokerConfig` / :class:`AgentConfig`, and each ``[section]`` is the
nested dataclass of the same name (``[rudp]`` is :class:`rudp.config.RudpConfig` itself).
One generic reader walks the dataclass type hints, so that every key is checked the same
way: unknown keys are refused (``broker.toml: unknown key 'queue.maxx'``), a value of the
wrong type is refused naming its key, and each dataclass validates its ranges in
``__post_init__``. Every field has a documented default except the agent's ``aor`` and
password.

Paths: a relative path written in the file is resolved against the folder of the file.
Paths left at their default live in the node's data folder (``data_dir`` for the broker,
``state_dir`` for the agent), which itself defaults to a folder beside the file. A SQLite
URL with a relative path (``sqlite:///broker.db``) is resolved against ``data_dir``.

One schema: the parts of the broker that take settings read these same dataclasses, so
nothing is translated by hand and each default is written once. The broker core takes
:class:`BrokerCoreConfig` (``[queue]`` and ``[subscriptions]``, via
:attr:`BrokerConfig.core`); the RUDP layer takes ``[rudp]`` (:class:`rudp.config.RudpConfig`);
the SIP transaction timers are :attr:`SipConfig.timers`, whose defaults are those of
:class:`sip.timers.TimerConfig`.

Secrets: ``password = "..."`` or ``password_env = "VARIABLE"`` (read here, once); the rest
of the code never reads files or the environment for settings.

Layout: :mod:`.common` holds the sections both nodes share, :mod:`.broker` and
:mod:`.agent` each node's sections and loader, :mod:`.reader` the generic TOML reader.
Every name is imported from here.
"""

from mdeci.config.agent import (
    AgentConfig,
    AgentRegistrarConfig,
    AgentSmsConfig,
    BrokerPeerConfig,
    IpMonitorConfig,
    IpMonitorMode,
    ReconnectConfig,
    load_agent_config,
)
from mdeci.config.broker import (
    MIN_DEDUP_HORIZON,
    OVERFLOW_POLICIES,
    AuthConfig,
    BrokerConfig,
    BrokerCoreConfig,
    BrokerSmsConfig,
    LoginThrottleConfig,
    MetricsConfig,
    OverflowPolicy,
    OverflowPolicyName,
    QueueConfig,
    RegistrarConfig,
    StoreConfig,
    SubscriptionConfig,
    UserConfig,
    load_broker_config,
)
from mdeci.config.common import (
    ALLOWED_TRANSPORTS,
    DIGEST_ALGORITHMS,
    E164,
    MIB,
    SIP_AOR,
    SIP_STACKS,
    TRANSPORTS,
    USER_NAME,
    AgentMediaConfig,
    BrokerMediaConfig,
    ChurnLogConfig,
    HostPort,
    MediaConfig,
    SipConfig,
    SmsGatewayKind,
)

__all__ = [
    "ALLOWED_TRANSPORTS",
    "DIGEST_ALGORITHMS",
    "E164",
    "MIB",
    "MIN_DEDUP_HORIZON",
    "OVERFLOW_POLICIES",
    "SIP_AOR",
    "SIP_STACKS",
    "TRANSPORTS",
    "USER_NAME",
    "AgentConfig",
    "AgentMediaConfig",
    "AgentRegistrarConfig",
    "AgentSmsConfig",
    "AuthConfig",
    "BrokerConfig",
    "BrokerCoreConfig",
    "BrokerMediaConfig",
    "BrokerPeerConfig",
    "BrokerSmsConfig",
    "ChurnLogConfig",
    "HostPort",
    "IpMonitorConfig",
    "IpMonitorMode",
    "LoginThrottleConfig",
    "MediaConfig",
    "MetricsConfig",
    "OverflowPolicy",
    "OverflowPolicyName",
    "QueueConfig",
    "ReconnectConfig",
    "RegistrarConfig",
    "SipConfig",
    "SmsGatewayKind",
    "StoreConfig",
    "SubscriptionConfig",
    "UserConfig",
    "load_agent_config",
    "load_broker_config",
]
