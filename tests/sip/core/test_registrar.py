"""Registrar (RFC 3261 §10.3): every rule, on messages parsed from literal text."""

from __future__ import annotations

import random as _random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sip.auth import (
    AuthChallenge,
    AuthOk,
    DigestClient,
    DigestConfig,
    DigestServer,
    MemoryCredentialStore,
)
from sip.message import NameAddr, Request, Response, parse_message, serialize
from sip.registrar import (
    Binding,
    MemoryBindingStore,
    Registered,
    Registrar,
    RegistrarConfig,
    RegistrarEvent,
    RegistrationExpired,
    Unregistered,
    normalize_aor,
)

AOR = "sip:alice@example.org"


def source(seed: int = 1) -> Callable[[int], bytes]:
    return _random.Random(seed).randbytes


def register(
    *headers: str,
    cseq: int = 1,
    call_id: str = "reg-1@192.0.2.7",
    uri: str = "sip:example.org",
    to: str = "<sip:alice@example.org>",
    via: str = "SIP/2.0/UDP 192.0.2.7:5062;branch=z9hG4bK-r1",
    method: str = "REGISTER",
) -> Request:
    lines = [
        f"{method} {uri} SIP/2.0",
        f"Via: {via}",
        "Max-Forwards: 70",
        f"From: {to};tag=f1",
        f"To: {to}",
        f"Call-ID: {call_id}",
        f"CSeq: {cseq} {method}",
        *headers,
        "Content-Length: 0",
    ]
    msg = parse_message(("\r\n".join(lines) + "\r\n\r\n").encode())
    assert isinstance(msg, Request)
    return msg


def make(**kw: object) -> tuple[Registrar, MemoryBindingStore]:
    store = MemoryBindingStore()
    config = RegistrarConfig(domains=("example.org",), **kw)  # type: ignore[arg-type]
    return Registrar(config, store, source()), store


def events(reg: Registrar) -> list[RegistrarEvent]:
    out: list[RegistrarEvent] = []
    while (event := reg.next_event()) is not None:
        out.append(event)
    return out


def contacts(resp: Response) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in resp.headers.get_all("Contact"):
        na = NameAddr.parse(value)
        out[str(na.uri)] = int(na.params["expires"] or "")
    return out


def warning(resp: Response) -> str:
    return resp.headers.get("Warning") or ""


# ---------------------------------------------------------------- basic


def test_register_query_and_lookup() -> None:
    reg, _ = make()
    resp = reg.handle(register("Contact: <sip:alice@192.0.2.7:5062>", "Expires: 600"), 100.0)
    assert resp.status == 200
    assert resp.to.tag is not None
    assert resp.headers.get("Call-ID") == "reg-1@192.0.2.7"
    assert contacts(resp) == {"sip:alice@192.0.2.7:5062": 600}
    assert events(reg) == [
        Registered(AOR, "sip:alice@192.0.2.7:5062", 600, None, "reg-1@192.0.2.7", False)
    ]
    # A query (no Contact) lists the bindings with their remaining time.
    query = reg.handle(register(cseq=2), 400.0)
    assert query.status == 200
    assert contacts(query) == {"sip:alice@192.0.2.7:5062": 300}
    assert events(reg) == []
    assert reg.lookup("sip:alice@EXAMPLE.org:5060;transport=udp", 400.0) == [
        Binding(AOR, "sip:alice@192.0.2.7:5062", 700.0, "reg-1@192.0.2.7", 1)
    ]
    assert reg.lookup("not a uri", 400.0) == []


def test_default_expiry_and_configured_default() -> None:
    reg, _ = make()
    assert contacts(reg.handle(register("Contact: <sip:a@h>"), 0.0)) == {"sip:a@h": 3600}
    reg, _ = make(default_expires=600)
    assert contacts(reg.handle(register("Contact: <sip:a@h>"), 0.0)) == {"sip:a@h": 600}


def test_contact_param_beats_expires_header_and_several_contacts() -> None:
    reg, _ = make()
    resp = reg.handle(
        register(
            "Contact: <sip:alice@192.0.2.7:5062;transport=udp>;expires=120, <sip:alice@h2>;q=0.5",
            "Contact: <sip:alice@h3>;q=0.9",
            "Expires: 900",
        ),
        0.0,
    )
    assert resp.status == 200
    assert contacts(resp) == {
        "sip:alice@192.0.2.7:5062;transport=udp": 120,
        "sip:alice@h2": 900,
        "sip:alice@h3": 900,
    }
    assert [b.contact for b in reg.lookup(AOR, 1.0)] == [
        "sip:alice@192.0.2.7:5062;transport=udp",
        "sip:alice@h3",
        "sip:alice@h2",
    ]
    assert [v.split(">;", 1)[1] for v in resp.headers.get_all("Contact")] == [
        "expires=120",
        "expires=900;q=0.9",
        "expires=900;q=0.5",
    ]


def test_lookup_ties_go_to_the_latest_expiry() -> None:
    reg, _ = make()
    reg.handle(register("Contact: <sip:alice@old>", "Expires: 600"), 0.0)
    reg.handle(register("Contact: <sip:alice@new>", "Expires: 600", cseq=2), 50.0)
    assert [b.contact for b in reg.lookup(AOR, 60.0)] == ["sip:alice@new", "sip:alice@old"]


def test_refresh_with_higher_cseq_and_new_call_id() -> None:
    reg, _ = make()
    reg.handle(register("Contact: <sip:alice@h>", "Expires: 600"), 0.0)
    events(reg)
    resp = reg.handle(register("Contact: <sip:alice@h>", "Expires: 600", cseq=2), 100.0)
    assert contacts(resp) == {"sip:alice@h": 600}
    assert events(reg) == [Registered(AOR, "sip:alice@h", 600, None, "reg-1@192.0.2.7", True)]
    # Another Call-ID (e.g. the device rebooted) may update with any CSeq.
    resp = reg.handle(register("Contact: <sip:alice@h>", "Expires: 60", call_id="x", cseq=1), 200.0)
    assert resp.status == 200
    assert reg.lookup(AOR, 200.0)[0].call_id == "x"


def test_expires_zero_removes_one_binding() -> None:
    reg, _ = make()
    reg.handle(register("Contact: <sip:alice@h1>, <sip:alice@h2>"), 0.0)
    events(reg)
    resp = reg.handle(register("Contact: <sip:alice@h1>;expires=0", cseq=2), 10.0)
    assert resp.status == 200
    assert set(contacts(resp)) == {"sip:alice@h2"}
    assert events(reg) == [Unregistered(AOR, "sip:alice@h1", "reg-1@192.0.2.7")]
    # Removing what is not there is fine and says nothing.
    resp = reg.handle(register("Contact: <sip:alice@zz>", "Expires: 0", cseq=3), 10.0)
    assert resp.status == 200
    assert events(reg) == []


def test_star_with_expires_zero_removes_all() -> None:
    reg, store = make()
    reg.handle(register("Contact: <sip:alice@h1>, <sip:alice@h2>"), 0.0)
    events(reg)
    resp = reg.handle(register("Contact: *", "Expires: 0", cseq=2), 10.0)
    assert resp.status == 200
    assert resp.headers.get_all("Contact") == []
    assert store.bindings(AOR, 10.0) == []
    assert {e.contact for e in events(reg) if isinstance(e, Unregistered)} == {
        "sip:alice@h1",
        "sip:alice@h2",
    }


@pytest.mark.parametrize(
    "headers",
    [
        ("Contact: *",),
        ("Contact: *", "Expires: 10"),
        ("Contact: *, <sip:alice@h>", "Expires: 0"),
        ("Contact: *", "Contact: <sip:alice@h>", "Expires: 0"),
    ],
)
def test_star_misuse_is_400(headers: tuple[str, ...]) -> None:
    reg, store = make()
    reg.handle(register("Contact: <sip:alice@h1>"), 0.0)
    resp = reg.handle(register(*headers, cseq=2), 1.0)
    assert resp.status == 400
    assert "Contact: *" in warning(resp)
    assert len(store.bindings(AOR, 1.0)) == 1


# ---------------------------------------------------------------- intervals


def test_too_brief_is_423_with_min_expires() -> None:
    reg, store = make(min_expires=60)
    resp = reg.handle(
        register("Contact: <sip:alice@h1>, <sip:alice@h2>;expires=30", "Expires: 600"), 0.0
    )
    assert resp.status == 423
    assert resp.reason == "Interval Too Brief"
    assert resp.headers.get("Min-Expires") == "60"
    # All or nothing: the valid first contact was not stored either.
    assert store.bindings(AOR, 0.0) == []
    assert events(reg) == []
    assert reg.handle(register("Contact: <sip:alice@h1>", "Expires: 60"), 0.0).status == 200


def test_long_intervals_are_clamped() -> None:
    reg, _ = make(max_expires=7200)
    resp = reg.handle(register("Contact: <sip:alice@h>", "Expires: 4294967296"), 0.0)
    assert contacts(resp) == {"sip:alice@h": 7200}


def test_config_validation() -> None:
    for kw in (
        {"domains": ()},
        {"domains": ("d",), "min_expires": 0},
        {"domains": ("d",), "min_expires": 4000, "default_expires": 5000},
        {"domains": ("d",), "default_expires": 10},
        {"domains": ("d",), "max_bindings": 0},
        {"domains": ("d",), "warn_agent": "two words"},
    ):
        with pytest.raises(ValueError):
            RegistrarConfig(**kw)


# ---------------------------------------------------------------- ordering


def test_same_call_id_lower_or_equal_cseq_is_500_and_changes_nothing() -> None:
    reg, store = make()
    reg.handle(register("Contact: <sip:alice@h>", "Expires: 600", cseq=5), 0.0)
    events(reg)
    for cseq in (5, 4):
        resp = reg.handle(register("Contact: <sip:alice@h>", "Expires: 0", cseq=cseq), 1.0)
        assert resp.status == 500
        assert "CSeq" in warning(resp)
        assert warning(resp).startswith("399 mdeci ")
    assert [b.cseq for b in store.bindings(AOR, 1.0)] == [5]
    assert events(reg) == []
    # The star form checks every binding too.
    resp = reg.handle(register("Contact: *", "Expires: 0", cseq=5), 1.0)
    assert resp.status == 500
    assert len(store.bindings(AOR, 1.0)) == 1
    # A new contact with the same old CSeq has no binding to be older than.
    assert reg.handle(register("Contact: <sip:alice@other>", cseq=3), 1.0).status == 200


def test_out_of_order_fails_whole_request() -> None:
    reg, store = make()
    reg.handle(register("Contact: <sip:alice@h1>", cseq=5), 0.0)
    resp = reg.handle(register("Contact: <sip:alice@h2>, <sip:alice@h1>", cseq=3), 1.0)
    assert resp.status == 500
    assert [b.contact for b in store.bindings(AOR, 1.0)] == ["sip:alice@h1"]


# ---------------------------------------------------------------- expiry


def test_expire_emits_events_and_hides_bindings() -> None:
    reg, store = make()
    via = "SIP/2.0/UDP 10.0.0.5:5062;branch=z9hG4bK-x;received=203.0.113.9;rport=40000"
    reg.handle(register("Contact: <sip:alice@h>", "Expires: 60", via=via), 0.0)
    assert events(reg)[0] == Registered(
        AOR, "sip:alice@h", 60, "203.0.113.9:40000", "reg-1@192.0.2.7", False
    )
    assert reg.lookup(AOR, 59.0) != []
    assert reg.lookup(AOR, 60.0) == []
    gone = reg.expire(61.0)
    assert [b.contact for b in gone] == ["sip:alice@h"]
    assert events(reg) == [RegistrationExpired(AOR, "sip:alice@h", "203.0.113.9:40000")]
    assert reg.expire(62.0) == []
    assert store.bindings(AOR, 0.0) == []


def test_source_override_and_ipv6_via() -> None:
    reg, _ = make()
    reg.handle(register("Contact: <sip:alice@h>"), 0.0, source="127.0.0.2:5062")
    assert reg.lookup(AOR, 0.0)[0].source == "127.0.0.2:5062"
    via = "SIP/2.0/UDP [2001:db8::1]:5062;branch=z9hG4bK-y;rport=5070"
    reg.handle(register("Contact: <sip:alice@h6>", via=via, cseq=2), 0.0)
    bindings = {b.contact: b.source for b in reg.lookup(AOR, 0.0)}
    assert bindings["sip:alice@h6"] == "[2001:db8::1]:5070"


# ---------------------------------------------------------------- refusals


def test_other_methods_are_405() -> None:
    reg, _ = make()
    resp = reg.handle(register(method="OPTIONS"), 0.0)
    assert resp.status == 405
    assert resp.headers.get("Allow") == "REGISTER"


@pytest.mark.parametrize(
    ("kw", "status"),
    [
        ({"uri": "sip:other.org"}, 404),
        ({"uri": "tel:+15551234"}, 404),
        ({"to": "<sip:alice@other.org>"}, 404),
        ({"to": "<sip:example.org>"}, 404),
        ({"to": "<tel:+15551234>"}, 404),
    ],
)
def test_domain_and_aor_checks(kw: dict[str, str], status: int) -> None:
    reg, store = make()
    resp = reg.handle(register("Contact: <sip:alice@h>", **kw), 0.0)  # type: ignore[arg-type]
    assert resp.status == status
    assert warning(resp)
    assert store.expire(1e12) == []


def test_domain_match_is_case_insensitive() -> None:
    reg, _ = make()
    resp = reg.handle(
        register("Contact: <sip:alice@h>", uri="sip:EXAMPLE.ORG", to="<sip:alice@Example.Org>"),
        0.0,
    )
    assert resp.status == 200
    assert reg.lookup(AOR, 0.0) != []


def test_require_is_420_with_unsupported() -> None:
    reg, _ = make()
    resp = reg.handle(register("Contact: <sip:alice@h>", "Require: path, gruu"), 0.0)
    assert resp.status == 420
    assert resp.headers.get_all("Unsupported") == ["path", "gruu"]


@pytest.mark.parametrize(
    "headers",
    [
        ("Contact: <sip:alice@h>;expires=soon",),
        ("Contact: <sip:alice@h>;q=2",),
        ("Contact: <sip:alice@h",),
        ("Contact: not a uri",),
    ],
)
def test_bad_contacts_are_400(headers: tuple[str, ...]) -> None:
    reg, _ = make()
    resp = reg.handle(register(*headers), 0.0)
    assert resp.status == 400
    assert warning(resp)


def test_hand_built_request_with_bad_headers_is_400() -> None:
    reg, _ = make()
    req = register("Contact: <sip:alice@h>")
    req.headers.set("Expires", "soon")
    assert reg.handle(req, 0.0).status == 400
    req = register("Contact: <sip:alice@h>")
    req.headers.remove("To")
    assert reg.handle(req, 0.0).status == 400


def test_too_many_bindings_is_403() -> None:
    reg, store = make(max_bindings=2)
    assert reg.handle(register("Contact: <sip:alice@h1>, <sip:alice@h2>"), 0.0).status == 200
    resp = reg.handle(register("Contact: <sip:alice@h3>", cseq=2), 0.0)
    assert resp.status == 403
    assert len(store.bindings(AOR, 0.0)) == 2
    # Swapping one for another in one request is fine.
    swap = register("Contact: <sip:alice@h1>;expires=0, <sip:alice@h3>", cseq=3)
    assert reg.handle(swap, 0.0).status == 200
    assert {b.contact for b in store.bindings(AOR, 0.0)} == {"sip:alice@h2", "sip:alice@h3"}


def test_duplicate_contact_in_one_request_last_wins() -> None:
    reg, _ = make()
    resp = reg.handle(register("Contact: <sip:alice@h>;expires=100, <sip:alice@h>;expires=200"), 0)
    assert contacts(resp) == {"sip:alice@h": 200}


# ---------------------------------------------------------------- auth


def make_auth() -> tuple[Registrar, MemoryBindingStore]:
    creds = MemoryCredentialStore()
    creds.add_password("alice", "example.org", "secret")
    creds.add_password("bob", "example.org", "hunter2")
    auth = DigestServer(DigestConfig(realm="example.org"), creds, source(5))
    store = MemoryBindingStore()
    config = RegistrarConfig(domains=("example.org",), default_expires=600)
    return Registrar(config, store, source(), auth=auth), store


def authed(
    reg: Registrar, client: DigestClient, req: Request, now: float
) -> tuple[Response, Response]:
    first = reg.handle(req, now)
    if first.status != 401:
        return first, first
    name, value = client.respond(first, req)
    retry = register(
        *[f"{n}: {v}" for n, v in req.headers if n in ("Contact", "Expires")],
        f"{name}: {value}",
        cseq=req.cseq.seq + 1,
        to=req.headers.get("To") or "",
    )
    return first, reg.handle(retry, now)


def test_auth_challenge_then_success() -> None:
    reg, store = make_auth()
    client = DigestClient("alice", "secret", source(9))
    first, second = authed(reg, client, register("Contact: <sip:alice@h>"), 0.0)
    assert first.status == 401
    assert len(first.headers.get_all("WWW-Authenticate")) == 2
    assert first.to.tag is not None
    assert store.bindings(AOR, 0.0)[0].contact == "sip:alice@h"
    assert second.status == 200
    assert contacts(second) == {"sip:alice@h": 600}


def test_auth_other_users_aor_is_403() -> None:
    reg, store = make_auth()
    client = DigestClient("bob", "hunter2", source(9))
    first, second = authed(reg, client, register("Contact: <sip:bob@h>"), 0.0)
    assert (first.status, second.status) == (401, 403)
    assert "bob may not register sip:alice@example.org" in warning(second)
    assert store.bindings(AOR, 0.0) == []


def test_auth_wrong_password_and_malformed_credentials() -> None:
    reg, store = make_auth()
    client = DigestClient("alice", "nope", source(9))
    first, second = authed(reg, client, register("Contact: <sip:alice@h>"), 0.0)
    assert (first.status, second.status) == (401, 401)
    bad = register("Contact: <sip:alice@h>", 'Authorization: Digest realm="example.org", nonce=')
    resp = reg.handle(bad, 0.0)
    assert resp.status == 400
    assert "credentials" in warning(resp)
    assert store.bindings(AOR, 0.0) == []


def test_auth_query_needs_credentials_too() -> None:
    reg, _ = make_auth()
    assert reg.handle(register(), 0.0).status == 401


def test_a_verifier_given_with_the_request_replaces_the_registrars_own() -> None:
    reg, store = make_auth()
    seen: list[Request] = []

    class Refuse:
        def verify(
            self, request: Request, now: float, *, proxy: bool = False
        ) -> AuthOk | AuthChallenge:
            seen.append(request)
            return AuthChallenge(headers=(), status=401, reason="locked")

    client = DigestClient("alice", "secret", source(9))
    req = register("Contact: <sip:alice@h>")
    name, value = client.respond(reg.handle(req, 0.0), req)
    retry = register("Contact: <sip:alice@h>", f"{name}: {value}", cseq=2)
    assert reg.handle(retry, 0.0, auth=Refuse()).status == 401  # good credentials, refused
    assert seen == [retry] and store.bindings(AOR, 0.0) == []
    assert reg.handle(retry, 0.0).status == 200  # the registrar's own verifier


# ---------------------------------------------------------------- store & helpers


def test_memory_store_contract() -> None:
    store = MemoryBindingStore()
    b1 = Binding(AOR, "sip:a@h1", 10.0, "c", 1)
    b2 = Binding(AOR, "sip:a@h2", 20.0, "c", 1, q=0.5, source="1.2.3.4:5")
    store.put(b1)
    store.put(b2)
    assert store.bindings(AOR, 0.0) == [b1, b2]
    assert store.bindings(AOR, 10.0) == [b2]
    store.put(Binding(AOR, "sip:a@h1", 30.0, "c", 2))
    assert [b.cseq for b in store.bindings(AOR, 0.0)] == [2, 1]
    store.remove(AOR, "sip:a@h1")
    store.remove(AOR, "sip:a@none")
    store.remove("sip:nobody@x", "sip:a@h1")
    assert store.bindings(AOR, 0.0) == [b2]
    assert store.expire(20.0) == [b2]
    assert store.bindings(AOR, 0.0) == []
    store.put(b1)
    store.remove_all(AOR)
    store.remove_all(AOR)
    assert store.bindings(AOR, 0.0) == []


def test_normalize_aor() -> None:
    assert normalize_aor("sip:alice@Example.ORG:5070;transport=tcp") == AOR
    assert normalize_aor("sips:bob@x") == "sips:bob@x"


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["h1", "h2", "h3", "*"]),
            st.sampled_from([None, 0, 30, 60, 600, 9_999_999_999]),
            st.integers(1, 6),
            st.sampled_from(["c1", "c2"]),
            st.floats(0, 1000),
        ),
        max_size=12,
    )
)
def test_random_sequences_keep_invariants(
    steps: list[tuple[str, int | None, int, str, float]],
) -> None:
    reg, store = make(min_expires=60, max_expires=3600, max_bindings=2)
    now = 0.0
    for host, expires, cseq, call_id, dt in steps:
        now += dt
        contact = "Contact: *" if host == "*" else f"Contact: <sip:alice@{host}>"
        extra = [] if expires is None else [f"Expires: {expires}"]
        resp = reg.handle(register(contact, *extra, cseq=cseq, call_id=call_id), now)
        assert resp.status in (200, 400, 403, 423, 500)
        current = store.bindings(AOR, now)
        assert len(current) <= 2
        assert all(now < b.expires_at <= now + 3600 for b in current)
        if resp.status == 200:
            listed = contacts(resp)
            assert set(listed) == {b.contact for b in current}
            assert all(0 < v <= 3600 for v in listed.values())
        reg.expire(now)
    for event in events(reg):
        assert isinstance(event, Registered | Unregistered | RegistrationExpired)


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["h1", "h2", "h3", "*"]),
            st.sampled_from([None, 0, 30, 60, 600]),
            st.integers(1, 6),
            st.sampled_from(["c1", "c2"]),
            st.floats(0, 1000),
        ),
        max_size=10,
    )
)
def test_a_registrar_without_events_answers_and_stores_alike(
    steps: list[tuple[str, int | None, int, str, float]],
) -> None:
    config = RegistrarConfig(domains=("example.org",), max_expires=3600, max_bindings=2)
    loud = Registrar(config, MemoryBindingStore(), source())
    quiet = Registrar(config, MemoryBindingStore(), source(), events=False)
    now = 0.0
    for host, expires, cseq, call_id, dt in steps:
        now += dt
        contact = "Contact: *" if host == "*" else f"Contact: <sip:alice@{host}>"
        extra = [] if expires is None else [f"Expires: {expires}"]
        request = register(contact, *extra, cseq=cseq, call_id=call_id)
        assert serialize(loud.handle(request, now)) == serialize(quiet.handle(request, now))
        assert loud.expire(now) == quiet.expire(now)
        assert loud.lookup(AOR, now) == quiet.lookup(AOR, now)
    assert quiet.next_event() is None
