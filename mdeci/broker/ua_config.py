"""The broker's own SIP user agent, configured from ``[sip]``, ``[registrar]`` and its
own ``[[auth.users]]`` entry."""

from __future__ import annotations

from mdeci.config import BrokerConfig
from mdeci.errors import ConfigError
from sip.aio.ua import UaConfig


def broker_password(config: BrokerConfig) -> str | None:
    """The broker's own password at an external registrar: the ``[[auth.users]]`` entry
    whose ``user`` is the broker's (None with the embedded registrar).

    Raises :class:`ConfigError` when it is missing.
    """
    if config.registrar.embedded:
        return None
    own = [u for u in config.auth.users if u.user == config.user]
    if not own:
        raise ConfigError(
            f"registrar.embedded = false needs an [[auth.users]] entry for "
            f"{config.user!r} (the broker's password at the external registrar)"
        )
    return own[0].password


def _proxy(config: BrokerConfig) -> frozenset[tuple[str, int]]:
    """The external registrar's address (an IP literal matches the probes' source)."""
    address = config.registrar.address
    if config.registrar.embedded or address is None:
        return frozenset()
    return frozenset({(address.host, address.port)})


def ua_config(config: BrokerConfig) -> UaConfig:
    """The broker's UA from ``[sip]``: its transports (TLS only when listed), timers."""
    sip, tls = config.sip, "tls" in config.sip.transports
    return UaConfig(
        aor=config.aor,
        password=broker_password(config),
        timers=sip.timers,
        tcp="tcp" in sip.transports,
        tls_port=sip.tls_port,
        tls_cert=str(sip.tls_cert) if tls and sip.tls_cert is not None else None,
        tls_key=str(sip.tls_key) if tls and sip.tls_key is not None else None,
        tls_ca=None if sip.tls_ca is None else str(sip.tls_ca),
        user_agent="mdeci-broker/0.1",
        # No 100 Trying before a challenge, and no unauthenticated answer larger than
        # its request allows (docs/security.md).
        trying_delay=0.2,
        max_answer_ratio=config.auth.max_answer_ratio or None,
        # The external registrar is the proxy in front of us (Kamailio): its dispatcher's
        # OPTIONS probes are smaller than our 200, and it is no third party.
        unbounded_sources=_proxy(config),
        # Agents bound no answers by size: the broker's own requests need no padding.
        pad_to=0,
        # Allow names what this mode serves: REGISTER only as the registrar.
        methods=frozenset({"INVITE", "REGISTER"} if config.registrar.embedded else {"INVITE"}),
    )
