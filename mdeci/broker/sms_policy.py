"""The SMS side's policy: its channels, limits, link settings and gateway, from the
broker's configuration (``[sms]``, ``[channels]``)."""

from __future__ import annotations

from mdeci.broker.errors import BrokerError
from mdeci.channels import Channel, Kind, Period, SelectorPolicy
from mdeci.channels.config import ChannelsConfig, IpConfig, LimitConfig
from mdeci.channels.live import Figures
from mdeci.config import BrokerSmsConfig, SmsGatewayKind
from mdeci.sms import sms_tariff
from mdeci.sms.config import SmsConfig
from mdeci.sms.gateway import SmsGateway, network_gateway

SMS_CHANNEL = "sms"
IP_CHANNEL = "ip"


def sms_channel(config: BrokerSmsConfig, link: SmsConfig | None, figures: Figures) -> Channel:
    """The SMS channel: ``[sms] price`` per SMS (a frame costs its segments), live L, V."""
    return Channel(
        name=SMS_CHANNEL,
        kind=Kind.SMS,
        tariff=sms_tariff(config.price, link),
        energy_mw=config.energy_mw,
        latency_ms=figures.latency_ms,
        coverage=figures.coverage,
    )


def ip_channel(config: IpConfig, figures: Figures) -> Channel:
    """The IP channel: ``[channels.ip]`` tariff and energy, live L and V."""
    return Channel(
        name=IP_CHANNEL,
        kind=Kind.IP,
        tariff=config.tariff(),
        energy_mw=config.energy_mw,
        latency_ms=figures.latency_ms,
        coverage=figures.coverage,
    )


def sms_limits(config: BrokerSmsConfig) -> tuple[LimitConfig, ...]:
    """``[sms]``'s shorthand limits (per user, on SMS) as ``[[channels.limits]]``."""
    limits: list[LimitConfig] = []
    if config.day_messages is not None:
        limits.append(LimitConfig(period=Period.DAY, messages=config.day_messages))
    if config.month_messages is not None:
        limits.append(LimitConfig(period=Period.MONTH, messages=config.month_messages))
    if config.month_money is not None:
        limits.append(LimitConfig(period=Period.MONTH, money=config.month_money))
    return tuple(limits)


def sms_policy(
    config: BrokerSmsConfig,
    link: SmsConfig | None = None,
    channels: ChannelsConfig | None = None,
    *,
    user: str = "",
    ip: Figures | None = None,
    sms: Figures | None = None,
) -> SelectorPolicy:
    """``user``'s selector policy: the IP and SMS channels (with these figures, else the
    configured ones), the classes of ``[channels]`` and the per-user limits of
    ``[channels]`` and ``[sms]``."""
    chans = channels if channels is not None else ChannelsConfig()
    ip_now = ip if ip is not None else Figures(chans.ip.latency_ms, chans.ip.coverage)
    sms_now = sms if sms is not None else Figures(config.latency_ms, 1.0)
    extra = tuple(lim.limit() for lim in sms_limits(config))
    return SelectorPolicy(
        channels=(ip_channel(chans.ip, ip_now), sms_channel(config, link, sms_now)),
        classes=chans.classes_of(),
        limits=chans.limits_for(user) + extra,
    )


def link_config(config: BrokerSmsConfig) -> SmsConfig:
    """The broker's SMS link settings from ``[sms]``."""
    return SmsConfig(
        ack_timeout=config.ack_timeout,
        ack_timeout_max=config.ack_timeout_max,
        first_part_ack=config.first_part_ack,
        default_ttl=config.ttl,
        authenticated=True,
    )


def make_gateway(config: BrokerSmsConfig) -> SmsGateway:
    """The gateway ``[sms] gateway`` names.

    Raises :class:`BrokerError` for ``"simulated"``: that network reaches no phone (tests
    hand the broker a gateway of their own network); a standalone broker must say how to
    reach phones (``"kannel"``: docs/sms.md "Loopback with Kannel and fakesmsc").
    """
    if config.gateway is SmsGatewayKind.SIMULATED:
        raise BrokerError(
            '[sms] gateway = "simulated" reaches no phone outside tests: set gateway = '
            '"kannel" (docs/sms.md "Loopback with Kannel and fakesmsc") or "smpp", '
            "or enabled = false"
        )
    gateway = network_gateway(config)
    if gateway is not None:
        return gateway
    raise AssertionError(f"gateway kind {config.gateway} not handled")  # a programming error
