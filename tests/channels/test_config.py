"""``[channels]`` of broker.toml: typed classes, IP tariff and limits; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from mdeci.broker.errors import BrokerError
from mdeci.broker.sms import make_gateway, sms_policy
from mdeci.channels import Kind, Period
from mdeci.channels.config import ChannelsConfig, Scope
from mdeci.config import BrokerSmsConfig, SmsGatewayKind, load_broker_config
from mdeci.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_has_the_three_classes_and_its_limits() -> None:
    cfg = load_broker_config(ROOT / "configs" / "broker.toml", env={})
    ch = cfg.channels
    assert [c.name for c in ch.classes] == ["urgent", "normal", "bulk"]
    classes = ch.classes_of()
    assert classes["urgent"].kinds == frozenset({Kind.IP, Kind.SMS})
    assert classes["bulk"].max_delay == 3600.0 and classes["bulk"].weights.cost == 1.0
    assert ch.ip.price == pytest.approx(30 / (6 * 1024 * 1024))
    (monthly,) = ch.limits_for("sip:alice@localhost")
    assert (monthly.period, monthly.channel, monthly.messages) == (Period.MONTH, "sms", 100)
    (budget,) = ch.limits_for("", scope=Scope.GLOBAL)
    assert (budget.period, budget.money) == (Period.DAY, 50.0)
    assert cfg.sms.ack_timeout == 200.0 and cfg.sms.first_part_ack
    policy = sms_policy(cfg.sms, None, ch, user="sip:alice@localhost")
    assert [c.name for c in policy.channels] == ["ip", "sms"]


def _load(tmp_path: Path, text: str) -> ChannelsConfig:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return load_broker_config(path, env={}).channels


def test_a_user_limit_applies_to_that_user_only(tmp_path: Path) -> None:
    ch = _load(
        tmp_path,
        '[[channels.limits]]\nperiod = "week"\nuser = "bob"\nqclass = "urgent"\nbytes = 900\n',
    )
    assert ch.limits_for("sip:alice@localhost") == ()
    (lim,) = ch.limits_for("sip:bob@localhost")
    assert (lim.period, lim.qclass, lim.bytes) == (Period.WEEK, "urgent", 900)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[[channels.classes]]\nname = "x"\nwc = 0.9\n', "weights must sum to 1"),
        ('[[channels.classes]]\nname = "x"\nchannels = ["fax"]\n', "channels must be among"),
        ('[[channels.limits]]\nperiod = "year"\nmessages = 1\n', "'day' or 'week' or 'month'"),
        ('[[channels.limits]]\nperiod = "day"\n', "must bound messages, bytes or money"),
        ('[[channels.limits]]\nperiod = "day"\nqclass = "vip"\nmessages = 1\n', "class 'vip'"),
        (
            '[[channels.limits]]\nperiod = "day"\nscope = "global"\nuser = "a"\nmoney = 1\n',
            "global",
        ),
        ('[channels]\ndefault_class = "vip"\n', "class 'vip' is not among"),
        ("[channels.ip]\ncoverage = 0\n", "coverage"),
        ("[channels]\nalpha = 0\n", "alpha"),
        ("[channels]\nspeed = 3\n", "unknown key 'channels.speed'"),
    ],
)
def test_bad_channels_config_is_one_clear_line(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    message = str(err.value)
    assert words in message and "\n" not in message
    assert message.startswith(str(tmp_path / "broker.toml"))


def test_the_simulated_gateway_is_refused_outside_tests() -> None:
    config = BrokerSmsConfig(enabled=True, gateway=SmsGatewayKind.SIMULATED)
    with pytest.raises(BrokerError, match='gateway = "kannel"'):
        make_gateway(config)
