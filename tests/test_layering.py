"""The layering rules (sans-IO cores; lower layers never import upper ones), on the source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_MODULES = {"asyncio", "socket", "time", "os", "selectors", "threading"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _sources(package: str, exclude: tuple[str, ...] = ()) -> list[Path]:
    base = ROOT / package
    return [
        p
        for p in sorted(base.rglob("*.py"))
        if not any(part in exclude for part in p.relative_to(base).parts)
        and not p.name.startswith("__main__")
    ]


# The adapters (aio/), the command-line tools and the impairment proxy own the I/O.
ADAPTERS = ("aio", "aio.py", "tools", "impair.py", "cli.py")
# RUDP's wrappers of socket system calls (GSO writes, batched reads): no event loop, and
# no protocol (nothing of the packets, the connection or the endpoint's peers).
SOCKET_CALLS = ("gso.py", "sockets.py")
PROTOCOL = {"rudp.packet", "rudp.connection", "rudp.endpoint", "rudp.events", "rudp.path"}


@pytest.mark.parametrize("package", ["sip", "rudp", "quicdata"])
def test_protocol_cores_are_sans_io(package: str) -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & IO_MODULES)
        for p in _sources(package, ADAPTERS + SOCKET_CALLS)
        if _imports(p) & IO_MODULES
    }
    assert offenders == {}, f"sans-IO cores import I/O modules: {offenders}"


@pytest.mark.parametrize("name", SOCKET_CALLS)
def test_rudp_socket_calls_hold_no_loop_and_no_protocol(name: str) -> None:
    path = ROOT / "rudp" / name
    assert _imports(path) & (IO_MODULES - {"socket"}) == set()
    modules = _imported_modules(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:  # from rudp import packet
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    assert modules & PROTOCOL == set()


def test_rudp_asyncio_glue_stays_small() -> None:
    """The decisions are the cores'; what rudp/aio does is wire them to the loop."""
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "rudp" / "aio").glob("*.py"))
    assert lines <= 300, f"rudp/aio is {lines} lines"


def test_quicdata_asyncio_glue_stays_small() -> None:
    lines = len((ROOT / "quicdata" / "aio.py").read_text().splitlines())
    assert lines <= 300, f"quicdata/aio.py is {lines} lines"


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("sip", {"mdeci", "rudp", "quicdata", "analytics"}),
        ("rudp", {"mdeci", "sip", "quicdata", "analytics"}),
        ("quicdata", {"mdeci", "sip", "rudp", "analytics"}),
        ("analytics", {"mdeci", "sip", "rudp", "quicdata"}),
    ],
)
def test_lower_layers_do_not_import_upper(package: str, forbidden: set[str]) -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & forbidden)
        for p in _sources(package)
        if _imports(p) & forbidden
    }
    assert offenders == {}


# The sans-IO cores outside sip/ and rudp/: events, frames and a clock in; commands out.
# No asyncio, sockets, threads, SQL (directly or through the store) or wall-clock reads.
SANS_IO_FORBIDDEN = IO_MODULES | {"sqlalchemy", "psycopg", "sqlite3", "datetime"}


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, by its full dotted name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# The store's modules of plain data (errors, records); the others run SQL.
STORE_DATA = {"mdeci.store.errors", "mdeci.store.queue_rows", "mdeci.store.subscription_rows"}


def _sans_io_offences(path: Path) -> list[str]:
    found = sorted(_imports(path) & SANS_IO_FORBIDDEN)
    # The store's modules run SQL; its errors and plain row types are data.
    found += sorted(
        m for m in _imported_modules(path) if m.startswith("mdeci.store.") and m not in STORE_DATA
    )
    return found


@pytest.mark.parametrize(
    "module",
    [
        "mdeci/broker/sessions.py",
        "mdeci/broker/sms_sessions.py",
        "mdeci/broker/core.py",
        "mdeci/broker/delivery.py",
        "mdeci/agent/core.py",
        "mdeci/agent/liveness.py",
        "mdeci/agent/reports.py",
        "mdeci/agent/driver.py",
    ],
)
def test_cores_of_the_application_are_sans_io(module: str) -> None:
    assert _sans_io_offences(ROOT / module) == []


@pytest.mark.parametrize("module", sorted(STORE_DATA))
def test_the_store_modules_a_core_may_import_are_plain_data(module: str) -> None:
    path = ROOT / (module.replace(".", "/") + ".py")
    assert _sans_io_offences(path) == []


# What only the Session Manager (and its one writer of rows) may do in the broker.
SESSION_OWNERS = {"sessions.py", "sms_sessions.py", "session_rows.py"}
STATUS_WRITES = {"set_status", "upsert_session"}
# Per-user connection state: a session's status, epoch, proof and key deadline, and the
# SMS fallback's fields of a user (sms_sessions.SmsSession).
SESSION_FIELDS = {"status", "epoch", "delivering", "connected", "ip_proved", "proved",
                  "heard", "key_deadline", "decided", "noted", "untold", "ip_seen",
                  "retry_armed"}  # fmt: skip
# Maps by URI or dialog of a session's state, as the broker's modules named them: the
# SIP endpoint's and the service's, then the SMS fallback's (in flight by user, holds
# logged, highest nseq decided, limits told and waiting for IP, RUDP counters seen,
# looks running and asked again, plan epochs, numbers seen).
SESSION_MAPS = {"_sessions", "_owners", "_origins", "_versions", "_key_checks", "_accepted",
                "_links_by_uri", "_by_user", "_noted", "_decided", "_told", "_untold",
                "_ip_seen", "_looking", "_again", "_epochs", "_users_by_number"}  # fmt: skip
SESSION_TYPES = {"UserSession", "SessionRecord", "_Session", "SessionStatus", "SmsSession"}


def _session_state_offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    # Fields of frozen dataclasses are values handed over (an event, a plan's input),
    # not state kept.
    snapshots = {
        item
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        and any("frozen=True" in ast.unparse(d) for d in cls.decorator_list)
        for item in cls.body
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in STATUS_WRITES
        ):
            found.append(f"{node.lineno}: writes a session status ({node.func.attr})")
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in SESSION_FIELDS:
                found.append(f"{target.lineno}: sets a session's {target.attr}")
            if isinstance(target, ast.Attribute) and target.attr in SESSION_MAPS:
                found.append(f"{target.lineno}: keeps a per-user session map {target.attr}")
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id in SESSION_FIELDS
            and node not in snapshots
        ):
            found.append(f"{node.lineno}: has a session field {node.target.id}")
        if isinstance(node, ast.AnnAssign) and node.annotation is not None:
            text = ast.unparse(node.annotation)
            if text.startswith("dict[") and any(t in text for t in SESSION_TYPES):
                found.append(f"{node.lineno}: keeps a map of sessions ({text})")
    return found


def test_only_the_session_manager_owns_session_state() -> None:
    offenders = {
        p.name: _session_state_offences(p)
        for p in _sources("mdeci/broker")
        if p.name not in SESSION_OWNERS and _session_state_offences(p)
    }
    assert offenders == {}, f"per-user session state outside the Session Manager: {offenders}"


def test_the_session_state_check_sees_what_it_forbids(tmp_path: Path) -> None:
    """The check above is not vacuous: each kind of offence is found."""
    source = tmp_path / "offender.py"
    source.write_text(
        "@dataclass(frozen=True)\n"
        "class Seen:\n"
        "    connected: bool\n"
        "class Link:\n"
        "    delivering: bool = False\n"
        "def f(self, store, link):\n"
        "    store.sessions.set_status('u', 'CONNECTED', 0.0)\n"
        "    link.epoch += 1\n"
        "    self._sessions = {}\n"
        "    self.by_uri: dict[str, UserSession] = {}\n"
    )
    found = _session_state_offences(source)
    assert len(found) == 5, found


# The maps the SMS side keeps, each classified: the link's transport state, the I/O
# handles the Session Manager's SMS commands drive, configuration, and caches of what
# the config, the calendars and the live figures say. A user's SMS fields are the
# Session Manager's (sms_sessions.SmsSession); a new map here must be classified first.
SMS_GLUE_MAPS = {
    "_buffers": "SMS buffers in flight by buffer id: the link's transport state",
    "_timers": "retry timer handles by URI (ArmRetry / CancelRetry)",
    "_looks": "the tasks of the looks running (StartLook)",
    "_key_tasks": "the tasks reading SMS keys",
    "_keying": "numbers whose HA1 is being read",
    "_defaults": "the operator's numbers by URI: configuration",
    "_uri_by_number": "the same, by number",
    "received": "the latest MO frames from anybody, bounded",
    "_policies": "selector policies from the config and the live figures",
    "_free": "the same policies without their limits",
    "_calendars": "the devices' calendars as read from the store",
}
SMS_GLUE = ("sms.py", "sms_plan.py", "sms_policy.py")
_CONTAINERS = (ast.Dict, ast.Set, ast.List, ast.DictComp, ast.SetComp, ast.ListComp)


def _containers_kept(path: Path) -> dict[str, int]:
    """``self.X`` attributes ``path`` sets to a dict, set, list or deque: name -> line."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        target: ast.expr | None = None
        if isinstance(node, ast.AnnAssign):
            text = ast.unparse(node.annotation)
            if text.split("[")[0] in {"dict", "set", "list", "deque", "defaultdict"}:
                target = node.target
        elif isinstance(node, ast.Assign) and (
            isinstance(node.value, _CONTAINERS)
            or (
                isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) in {"dict", "set", "list", "deque"}
            )
        ):
            target = node.targets[0]
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
        ):
            found.setdefault(target.attr, target.lineno)
    return found


def test_the_sms_side_keeps_no_per_user_fields() -> None:
    offenders = [
        f"{name}:{line}: {attr}"
        for name in SMS_GLUE
        for attr, line in _containers_kept(ROOT / "mdeci/broker" / name).items()
        if attr not in SMS_GLUE_MAPS
    ]
    assert offenders == [], f"maps of the SMS side not classified: {offenders}"


def test_the_sms_map_check_sees_what_it_forbids(tmp_path: Path) -> None:
    source = tmp_path / "sms.py"
    source.write_text(
        "class S:\n"
        "    def __init__(self):\n"
        "        self._buffers: dict[int, object] = {}\n"
        "        self._seen_by_user: dict[str, int] = {}\n"
        "        self.waiting = {u: [] for u in ()}\n"
        "        self.marks = set()\n"
    )
    kept = _containers_kept(source)
    assert sorted(a for a in kept if a not in SMS_GLUE_MAPS) == [
        "_seen_by_user",
        "marks",
        "waiting",
    ]


def test_sql_only_in_store() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources("mdeci", ("store",))
        if "sqlalchemy" in _imports(p)
    ]
    assert offenders == []


# The repository stands on its own: docs/ is the reference, never the design notes that
# lived beside it before the project existed. The conformance corpus beside it is a test
# input (a peer's data, as Kamailio is a peer), not a reference.
OUTSIDE_REFERENCES = re.compile(
    r"\.\./shared(?!/conformance)|(?<![\w/])(PROTOCOL|ARCHITECTURE|STYLE|PJSUA2)\.md"
)


def test_nothing_cites_files_outside_the_repository() -> None:
    texts = [
        p
        for folder in ("sip", "rudp", "mdeci", "analytics", "tests", "docs", "configs")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in {".py", ".md", ".toml", ".cfg", ".conf"}
    ] + [ROOT / "README.md"]
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in texts
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if OUTSIDE_REFERENCES.search(line) and p != Path(__file__)
    ]
    assert offenders == [], f"cite docs/ instead: {offenders}"
