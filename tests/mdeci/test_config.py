"""Config loading: the shipped files, defaults, paths, secrets and one-line errors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from mdeci.config import (
    AgentConfig,
    BrokerConfig,
    HostPort,
    IpMonitorMode,
    OverflowPolicy,
    QueueConfig,
    SipConfig,
    load_agent_config,
    load_broker_config,
)
from mdeci.config.agent import AgentCalendarConfig
from mdeci.config.reader import UNREAD_SECRET
from mdeci.errors import ConfigError, MdeciError
from rudp.config import RudpConfig

ROOT = Path(__file__).resolve().parents[2]
AGENT_MIN = 'aor = "sip:alice@localhost"\npassword = "pw"\n'


def write(tmp_path: Path, text: str, name: str = "broker.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, "utf-8")
    return path


def broker_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_broker_config(write(tmp_path, text), env=env or {})
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, MdeciError)
    return message


def agent_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_agent_config(write(tmp_path, text, "agent.toml"), env=env or {})
    assert "\n" not in str(info.value)
    return str(info.value)


# ---------------------------------------------------------------------------------------
# The shipped files
# ---------------------------------------------------------------------------------------


def test_shipped_broker_config_loads() -> None:
    cfg = load_broker_config(ROOT / "configs" / "broker.toml", env={})
    assert cfg.aor == "sip:broker@localhost"
    assert cfg.sip.host == "127.0.0.1"
    assert cfg.data_dir == ROOT / "var"
    assert cfg.store.url == f"sqlite:///{ROOT / 'var' / 'broker.db'}"
    assert cfg.churnlog.path == ROOT / "var" / "broker-churn.log"
    assert cfg.queue.overflow is OverflowPolicy.DROP_OLDEST
    assert {u.user for u in cfg.auth.users} == {"alice", "bob"}
    assert isinstance(cfg.rudp, RudpConfig)
    # The shipped file spells out the defaults of the delivery window, so an operator who
    # starts from it gets the measured defaults, not a stale copy of them.
    assert cfg.queue == QueueConfig()


def test_shipped_agent_config_loads() -> None:
    cfg = load_agent_config(ROOT / "configs" / "agent.toml", env={})
    assert cfg.aor == "sip:alice@localhost"
    assert cfg.broker.address == HostPort("127.0.0.1", 5060)
    assert cfg.registrar.expires == 600
    assert cfg.state_dir == ROOT / "var" / "agent-alice"
    assert cfg.api_socket == cfg.state_dir / "agent.sock"
    assert cfg.churnlog.path == cfg.state_dir / "churn.log"
    assert cfg.ip_monitor.mode is IpMonitorMode.NETLINK


def test_shipped_broker_users_match_agent() -> None:
    broker = load_broker_config(ROOT / "configs" / "broker.toml", env={})
    agent = load_agent_config(ROOT / "configs" / "agent.toml", env={})
    alice = next(u for u in broker.auth.users if agent.aor == f"sip:{u.user}@{broker.domain}")
    assert alice.password == agent.password
    assert agent.broker.aor == broker.aor


# ---------------------------------------------------------------------------------------
# Defaults and paths
# ---------------------------------------------------------------------------------------


def test_empty_broker_file_gives_documented_defaults(tmp_path: Path) -> None:
    cfg = load_broker_config(write(tmp_path, ""), env={})
    assert cfg.node == socket.gethostname() and cfg.user == "broker"
    assert cfg.domain == "localhost"
    assert cfg.sip == SipConfig()
    assert cfg.sip.port == 5060 and cfg.sip.transports == ("udp", "tcp")
    assert cfg.queue == QueueConfig(max_per_uri=1000, overflow=OverflowPolicy.DROP_OLDEST)
    assert cfg.subscriptions.default_ttl == 3600
    assert cfg.registrar.embedded is True
    assert cfg.rudp == RudpConfig()
    # the default database is var/broker.db beside the config file
    assert cfg.data_dir == tmp_path / "var"
    assert cfg.store.url == f"sqlite:///{tmp_path / 'var' / 'broker.db'}"
    assert cfg.churnlog.path == tmp_path / "var" / "broker-churn.log"
    assert cfg.realm == "localhost"


def test_dataclass_defaults_without_a_file() -> None:
    cfg = BrokerConfig()
    assert cfg.aor == "sip:broker@localhost"
    agent = AgentConfig(aor="sip:a@b", password="hunter2")
    assert agent.sip.port == 0 and agent.registrar.expires == 600
    assert agent.reconnect.base == 1.0 and agent.reconnect.max == 60.0
    assert "hunter2" not in repr(agent)  # secrets stay out of logs


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    sub = tmp_path / "etc"
    sub.mkdir()
    text = (
        'data_dir = "data"\n[store]\nurl = "sqlite:///db/x.db?timeout=5"\n'
        '[churnlog]\npath = "../logs/c.log"\n'
    )
    cfg = load_broker_config(write(sub, text), env={})
    assert cfg.data_dir == sub / "data"
    assert cfg.store.url == f"sqlite:///{sub / 'data' / 'db' / 'x.db'}?timeout=5"
    assert cfg.churnlog.path == tmp_path / "logs" / "c.log"


def test_absolute_and_other_urls_are_kept(tmp_path: Path) -> None:
    for url in (
        "sqlite:////abs/x.db",
        "sqlite://",
        "sqlite:///:memory:",
        "postgresql+psycopg://u:p@127.0.0.1:5432/db",
    ):
        cfg = load_broker_config(write(tmp_path, f'[store]\nurl = "{url}"\n'), env={})
        assert cfg.store.url == url


def test_agent_paths_default_into_state_dir(tmp_path: Path) -> None:
    cfg = load_agent_config(write(tmp_path, AGENT_MIN + 'state_dir = "st"\n', "a.toml"), env={})
    assert cfg.state_dir == tmp_path / "st"
    assert cfg.api_socket == tmp_path / "st" / "agent.sock"
    assert cfg.churnlog.path == tmp_path / "st" / "churn.log"
    explicit = AGENT_MIN + 'api_socket = "/run/mdeci.sock"\n[churnlog]\npath = "c.log"\n'
    cfg = load_agent_config(write(tmp_path, explicit, "b.toml"), env={})
    assert cfg.api_socket == Path("/run/mdeci.sock")
    assert cfg.churnlog.path == tmp_path / "c.log"
    assert cfg.state_dir == tmp_path / "var" / "agent"


def test_agent_full_sections(tmp_path: Path) -> None:
    text = AGENT_MIN + (
        'msisdn = "+5521999990001"\n'
        '[registrar]\naddress = "[::1]:5062"\nexpires = 300\n'
        '[broker]\naor = "sip:broker@example.org"\naddress = "10.0.0.1:5060"\n'
        "[reconnect]\nbase = 2\nmax = 30\njitter = 0\n"
        '[ip_monitor]\nmode = "poll"\npoll_interval = 0.5\ninterface = "eth0"\n'
        "[rudp]\nmax_retries = 3\nrto_min = 0.1\n"
    )
    cfg = load_agent_config(write(tmp_path, text, "agent.toml"), env={})
    assert cfg.registrar.address == HostPort("::1", 5062)
    assert str(cfg.registrar.address) == "[::1]:5062"
    assert cfg.registrar.expires == 300
    assert cfg.broker.address == HostPort("10.0.0.1", 5060)
    assert cfg.reconnect.base == 2.0 and isinstance(cfg.reconnect.base, float)
    assert cfg.ip_monitor.mode is IpMonitorMode.POLL
    assert cfg.ip_monitor.interface == "eth0"
    assert cfg.rudp.max_retries == 3 and cfg.rudp.rto_min == 0.1
    assert cfg.msisdn == "+5521999990001"


# ---------------------------------------------------------------------------------------
# Secrets and users
# ---------------------------------------------------------------------------------------


def test_password_from_environment(tmp_path: Path) -> None:
    text = 'aor = "sip:a@x"\npassword_env = "MY_PW"\n'
    cfg = load_agent_config(write(tmp_path, text, "agent.toml"), env={"MY_PW": "s3cret"})
    assert cfg.password == "s3cret"
    message = agent_error(tmp_path, text, env={})
    assert message.endswith("agent.toml: environment variable 'MY_PW' ('password_env') is not set")
    both = 'aor = "sip:a@x"\npassword = "a"\npassword_env = "MY_PW"\n'
    assert "not both" in agent_error(tmp_path, both, env={"MY_PW": "x"})


def test_password_is_required(tmp_path: Path) -> None:
    assert agent_error(tmp_path, 'aor = "sip:a@x"\n').endswith("missing key 'password'")
    assert agent_error(tmp_path, 'password = "x"\n').endswith("missing key 'aor'")


def test_the_answer_bound_is_the_brokers_to_set_or_turn_off(tmp_path: Path) -> None:
    from mdeci.broker.ua_config import ua_config

    default = load_broker_config(write(tmp_path, ""))
    assert ua_config(default).max_answer_ratio == 1.0
    off = load_broker_config(write(tmp_path, "[auth]\nmax_answer_ratio = 0\n"))
    assert ua_config(off).max_answer_ratio is None
    wider = load_broker_config(write(tmp_path, "[auth]\nmax_answer_ratio = 2.5\n"))
    assert ua_config(wider).max_answer_ratio == 2.5
    assert "'max_answer_ratio' must be >= 0" in broker_error(
        tmp_path, "[auth]\nmax_answer_ratio = -1\n"
    )


def test_only_the_external_registrar_is_exempt_from_the_answer_bound(tmp_path: Path) -> None:
    from mdeci.broker.ua_config import ua_config

    assert ua_config(load_broker_config(write(tmp_path, ""))).unbounded_sources == frozenset()
    external = load_broker_config(
        write(
            tmp_path,
            '[registrar]\nembedded = false\naddress = "127.0.0.1:5071"\n'
            '[[auth.users]]\nuser = "broker"\npassword = "x"\n',
        )
    )
    assert ua_config(external).unbounded_sources == {("127.0.0.1", 5071)}


def test_users_inline_file_and_env(tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text(
        '[[users]]\nuser = "carol"\npassword_env = "CAROL_PW"\n', "utf-8"
    )
    text = (
        '[auth]\nusers_file = "users.toml"\n'
        '[[auth.users]]\nuser = "alice"\npassword = "a"\nmsisdn = "+551199999"\n'
    )
    cfg = load_broker_config(write(tmp_path, text), env={"CAROL_PW": "c"})
    assert [(u.user, u.password) for u in cfg.auth.users] == [("alice", "a"), ("carol", "c")]
    assert cfg.auth.users_file == tmp_path / "users.toml"
    assert "password" not in repr(cfg.auth.users[1])


def test_a_loader_told_not_to_read_secrets_reads_no_password_env(tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text(
        '[[users]]\nuser = "carol"\npassword_env = "CAROL_PW"\n', "utf-8"
    )
    text = '[auth]\nusers_file = "users.toml"\n[[auth.users]]\nuser = "bob"\npassword_env = "B"\n'
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="'B'"):
        load_broker_config(path, env={})
    cfg = load_broker_config(path, env={}, secrets=False)
    assert [(u.user, u.password) for u in cfg.auth.users] == [
        ("bob", UNREAD_SECRET),
        ("carol", UNREAD_SECRET),
    ]


def test_users_file_errors_name_that_file(tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text('[[users]]\nuser = "x"\npasswd = "a"\n', "utf-8")
    message = broker_error(tmp_path, '[auth]\nusers_file = "users.toml"\n')
    assert message == f"{tmp_path / 'users.toml'}: unknown key 'users[0].passwd'"
    message = broker_error(tmp_path, '[auth]\nusers_file = "missing.toml"\n')
    assert message.endswith("missing.toml: no such file")


def test_duplicate_users_rejected(tmp_path: Path) -> None:
    (tmp_path / "users.toml").write_text('[[users]]\nuser = "a"\npassword = "x"\n', "utf-8")
    text = '[auth]\nusers_file = "users.toml"\n[[auth.users]]\nuser = "a"\npassword = "y"\n'
    assert "user 'a' is defined twice" in broker_error(tmp_path, text)


# ---------------------------------------------------------------------------------------
# Errors, each one line naming the key
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[queue]\nmaxx = 3\n", "unknown key 'queue.maxx'"),
        ("nod = 'x'\n", "unknown key 'nod'"),
        ("[queues]\nmax_per_uri = 3\n", "unknown key 'queues'"),
        ("[rudp]\nrto = 1\n", "unknown key 'rudp.rto'"),
        (
            "[[auth.users]]\nuser = 'a'\npassword = 'b'\nage = 3\n",
            "unknown key 'auth.users[0].age'",
        ),
        (
            "[queue]\nmax_per_uri = '10'\n",
            "key 'queue.max_per_uri' must be an integer, not a string",
        ),
        (
            "[queue]\nmax_per_uri = 1.5\n",
            "key 'queue.max_per_uri' must be an integer, not a number",
        ),
        ("[queue]\nmax_per_uri = true\n", "must be an integer, not a boolean"),
        ("[queue]\nmax_per_uri = 0\n", "[queue] 'max_per_uri' must be >= 1"),
        ("[queue]\ndedup_horizon = 0\n", "[queue] 'dedup_horizon' must be > 0 seconds"),
        ("[queue]\ndedup_horizon = 60\n", "[queue] 'dedup_horizon' must be at least 3600 seconds"),
        (
            "[queue]\noverflow = 'drop-newest'\n",
            "key 'queue.overflow' must be 'drop-oldest' or 'refuse-newest', not 'drop-newest'",
        ),
        ("[sip]\nport = 70000\n", "[sip] 'port' must be within 0..65535"),
        ("[sip]\nport = '5060'\n", "key 'sip.port' must be an integer, not a string"),
        ("[sip]\ntransports = 'udp'\n", "key 'sip.transports' must be an array, not a string"),
        ("[sip]\ntransports = ['udp', 'sctp']\n", "'transports' must be a non-empty list"),
        ("[sip]\ntransports = [1]\n", "key 'sip.transports[0]' must be a string, not an integer"),
        ("[sip]\nt1 = 5.0\nt2 = 4.0\n", "[sip] need 0 < t1 <= t2"),
        ("[sip]\nt1 = 'fast'\n", "key 'sip.t1' must be a number, not a string"),
        ("sip = 5\n", "key 'sip' must be a table, not an integer"),
        ("[rudp]\nrto_min = 5.0\n", "[rudp] need 0 < rto_min <= rto_initial <= rto_max"),
        ("[subscriptions]\ndefault_ttl = 10\nmax_ttl = 5\n", "need 1 <= default_ttl <= max_ttl"),
        ("[registrar]\nembedded = false\n", "'address' is required when embedded = false"),
        ("[registrar]\nembedded = 'no'\n", "key 'registrar.embedded' must be a boolean"),
        (
            "[registrar]\nembedded = false\naddress = 'kamailio'\n",
            "key 'registrar.address': address 'kamailio' is not host:port",
        ),
        ("[registrar]\naddress = '::1:5060'\n", "IPv6 host in brackets"),
        ("[registrar]\naddress = 'h:0'\n", "port 0 outside 1..65535"),
        ("[auth]\nalgorithms = ['SHA-512']\n", "'algorithms' must be a non-empty list"),
        ("[[auth.users]]\nuser = 'a b'\npassword = 'x'\n", "user 'a b' is not a SIP user"),
        ("[[auth.users]]\nuser = 'a'\npassword = 'x'\nmsisdn = '12345'\n", "is not E.164"),
        ("[[auth.users]]\nuser = 'a'\n", "missing key 'auth.users[0].password'"),
        ("[churnlog]\npath = ''\n", "key 'churnlog.path' must be a path string, not a string"),
        ("[churnlog]\nbackups = -1\n", "'backups' must be >= 0"),
        ("[store]\nurl = 'broker.db'\n", "is not a database URL"),
        ("domain = 'a@b'\n", "'domain' must be a host name"),
        ("data_dir = 2024-01-01\n", "key 'data_dir' must be a path string, not date"),
        ("node = \n", "Invalid value"),
    ],
)
def test_broker_errors(tmp_path: Path, text: str, expected: str) -> None:
    message = broker_error(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'broker.toml'}: ")
    assert expected in message, message


def test_unknown_key_message_is_exact(tmp_path: Path) -> None:
    path = write(tmp_path, "[queue]\nmaxx = 3\n")
    with pytest.raises(ConfigError) as info:
        load_broker_config(path, env={})
    assert str(info.value) == f"{path}: unknown key 'queue.maxx'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aor = 'alice@x'\npassword = 'p'\n", "'aor' 'alice@x' is not sip:user@domain"),
        (
            AGENT_MIN + "[broker]\naor = 'broker'\n",
            "[broker] 'aor' 'broker' is not sip:user@domain",
        ),
        (AGENT_MIN + "[ip_monitor]\nmode = 'inotify'\n", "must be 'netlink' or 'poll'"),
        (AGENT_MIN + "[ip_monitor]\npoll_interval = 0\n", "'poll_interval' must be > 0"),
        (AGENT_MIN + "[reconnect]\nbase = 10\nmax = 1\n", "need 0 < base <= max"),
        (AGENT_MIN + "[reconnect]\njitter = 2\n", "'jitter' must be within 0..1"),
        (AGENT_MIN + "[registrar]\nexpires = 0\n", "'expires' must be >= 1"),
        (AGENT_MIN + "msisdn = 'abc'\n", "'msisdn' 'abc' is not E.164"),
        (AGENT_MIN + "[broker]\naddress = 5060\n", "must be a 'host:port' string, not an integer"),
        (AGENT_MIN + "register_expires = 600\n", "unknown key 'register_expires'"),
        (AGENT_MIN + "password_env = 'X'\n", "not both"),
        (
            AGENT_MIN + "[[network.kinds]]\nkind = 'sms'\n",
            "[network.kinds[0]] 'sms' is not a network kind",
        ),
        (
            AGENT_MIN + "[[network.kinds]]\nkind = 'wifi'\nprefixes = ['10.0.0.300/8']\n",
            "network wifi: '10.0.0.300/8' is not an address range",
        ),
        (
            AGENT_MIN + "[[network.kinds]]\nkind = 'wifi'\nprice_per_mb = -1\n",
            "price_per_mb must be finite and >= 0",
        ),
        (
            AGENT_MIN + "[[network.kinds]]\nkind = 'wifi'\n[[network.kinds]]\nkind = 'wifi'\n",
            "network kinds must be unique",
        ),
        (AGENT_MIN + "[network]\nbattery = 1.5\n", "[network] 'battery' must be within 0..1"),
        (AGENT_MIN + "[[calendar.rules]]\nchannel = 'wifi'\np = 2\n", "'p' must be within 0..1"),
        (
            AGENT_MIN + "[[calendar.rules]]\nchannel = 'wifi'\np = 1\nweekdays = [7]\n",
            "'weekdays' must be within 0..6",
        ),
        (AGENT_MIN + "[calendar]\nutc_offset_minutes = 900\n", "'utc_offset_minutes' within"),
    ],
)
def test_agent_errors(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in agent_error(tmp_path, text)


def test_agent_network_and_calendar(tmp_path: Path) -> None:
    text = AGENT_MIN + (
        "[network]\nbattery = 0.4\n"
        "[[network.kinds]]\nkind = 'wifi'\ninterfaces = ['wlan0']\nprefixes = ['10.1.0.0/16']\n"
        "[[network.kinds]]\nkind = 'cellular'\nprice_per_mb = 0.005\nenergy_mw = 1500\n"
        "latency_ms = 250\nprefixes = ['10.0.0.0/8', 'fd00::/8']\n"
        "[calendar]\nutc_offset_minutes = 60\n"
        "[[calendar.rules]]\nchannel = 'wifi'\np = 0.9\nweekdays = [0, 1, 2, 3, 4]\n"
        "start_hour = 8\nend_hour = 18\n"
    )
    cfg = load_agent_config(write(tmp_path, text, "agent.toml"), env={})
    net = cfg.network
    assert [k.kind for k in net.kinds] == ["wifi", "cellular"] and net.battery == 0.4
    assert net.kinds[1].network().price_per_mb == 0.005
    # Interface first, then the first range holding the address.
    assert net.kind_of("10.2.0.1", "wlan0") == "wifi"
    assert net.kind_of("10.1.3.4") == "wifi" and net.kind_of("10.2.0.1") == "cellular"
    assert net.kind_of("fd00::5") == "cellular" and net.kind_of("192.0.2.1") is None
    rule = cfg.calendar.rules[0]
    assert rule.weekday_bits == 0x1F and (rule.start_hour, rule.end_hour) == (8, 18)
    calendar = cfg.calendar.calendar()
    assert calendar is not None and calendar.utc_offset_minutes == 60
    assert AgentCalendarConfig().calendar() is None  # no rules: no calendar


def test_missing_file_and_bad_encoding(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file$"):
        load_broker_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'node = "\xff"\n')
    with pytest.raises(ConfigError):
        load_broker_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_agent_config(tmp_path)  # a folder


# ---------------------------------------------------------------- one schema


def test_agent_sip_table_without_port_binds_any_port(tmp_path: Path) -> None:
    """A [sip] table that leaves out 'port' keeps the agent's documented default 0, not
    the broker's 5060."""
    cfg = load_agent_config(write(tmp_path, AGENT_MIN + '[sip]\nhost = "127.0.0.2"\n', "a.toml"))
    assert cfg.sip.port == 0
    assert cfg.sip.host == "127.0.0.2"


def test_broker_churnlog_table_without_path_keeps_the_broker_file(tmp_path: Path) -> None:
    cfg = load_broker_config(write(tmp_path, "[churnlog]\nbackups = 2\n"))
    assert cfg.churnlog.path.name == "broker-churn.log"
    assert cfg.churnlog.backups == 2


def test_core_takes_the_toml_sections_as_they_are(tmp_path: Path) -> None:
    text = (
        "[queue]\nmax_per_uri = 7\noverflow = 'refuse-newest'\nwindow = 5\n"
        "[subscriptions]\ndefault_ttl = 10\nmax_ttl = 20\nsweep_interval = 3\n"
    )
    core = load_broker_config(write(tmp_path, text)).core
    assert (core.max_queue_depth, core.overflow_policy, core.window) == (7, "refuse-newest", 5)
    assert (core.default_ttl, core.max_ttl, core.sweep_interval) == (10.0, 20.0, 3.0)


def test_each_default_in_one_place() -> None:
    """The core's defaults are the TOML defaults (one value per setting, such as the queue
    depth), and the SIP timers default to sip.transaction's."""
    from mdeci.broker import BrokerCoreConfig
    from sip.transaction import TimerConfig

    assert BrokerConfig().core == BrokerCoreConfig()
    assert BrokerCoreConfig().max_queue_depth == QueueConfig().max_per_uri == 1000
    assert SipConfig().timers == TimerConfig()


def test_overflow_values_agree_with_the_store() -> None:
    from typing import get_args

    from mdeci.store.queues import OverflowPolicy as StorePolicy

    assert [p.value for p in OverflowPolicy] == list(get_args(StorePolicy))


def test_window_and_overflow_errors_name_the_key(tmp_path: Path) -> None:
    assert "[queue] 'window' must be >= 1" in broker_error(tmp_path, "[queue]\nwindow = 0\n")
    message = broker_error(tmp_path, "[queue]\noverflow = 'drop-all'\n")
    assert "key 'queue.overflow' must be 'drop-oldest' or 'refuse-newest'" in message
