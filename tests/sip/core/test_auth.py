"""Digest authentication: known answers, client/server round trips, stale, replay, fuzz."""

from __future__ import annotations

import contextlib
import hashlib
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
    compute_ha1,
    compute_response,
    format_auth_params,
    parse_auth_header,
    parse_challenge,
    parse_credentials,
)
from sip.errors import AuthError, AuthHeaderError, AuthRejectedError, AuthUnsupportedError
from sip.message import Request, Response, parse_message

REALM = "example.org"


def rng(seed: int = 1) -> _random.Random:
    return _random.Random(seed)


def source(seed: int = 1) -> Callable[[int], bytes]:
    return rng(seed).randbytes


def register(*extra: str, uri: str = "sip:example.org", cseq: int = 1) -> Request:
    lines = [
        f"REGISTER {uri} SIP/2.0",
        "Via: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-1",
        "Max-Forwards: 70",
        "From: <sip:alice@example.org>;tag=a1",
        "To: <sip:alice@example.org>",
        "Call-ID: c1@192.0.2.1",
        f"CSeq: {cseq} REGISTER",
        *extra,
        "Content-Length: 0",
    ]
    msg = parse_message(("\r\n".join(lines) + "\r\n\r\n").encode())
    assert isinstance(msg, Request)
    return msg


def make_server(**kw: object) -> tuple[DigestServer, MemoryCredentialStore]:
    store = MemoryCredentialStore()
    store.add_password("alice", REALM, "secret")
    config = DigestConfig(realm=REALM, **kw)  # type: ignore[arg-type]
    return DigestServer(config, store, source(7), secret=b"k" * 32), store


def challenge_response(ch: AuthChallenge) -> Response:
    resp = Response(ch.status, "Unauthorized")
    for name, value in ch.headers:
        resp.headers.add(name, value)
    return resp


def with_header(req: Request, name: str, value: str) -> Request:
    headers = req.headers.copy()
    headers.set(name, value)
    return Request(req.method, req.uri, headers, req.body)


# ---------------------------------------------------------------- known answers


def test_rfc2617_md5_known_answer() -> None:
    # RFC 2617 §3.5.
    ha1 = compute_ha1("Mufasa", "testrealm@host.com", "Circle Of Life", "MD5")
    got = compute_response(
        algorithm="MD5",
        ha1=ha1,
        nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",
        method="GET",
        uri="/dir/index.html",
        qop="auth",
        nc="00000001",
        cnonce="0a4f113b",
    )
    assert got == "6629fae49393a05397450978507c4ef1"


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc7616_known_answers(algorithm: str, expected: str) -> None:
    # RFC 7616 §3.9.1.
    ha1 = compute_ha1("Mufasa", "http-auth@example.org", "Circle of Life", algorithm)
    got = compute_response(
        algorithm=algorithm,
        ha1=ha1,
        nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
        method="GET",
        uri="/dir/index.html",
        qop="auth",
        nc="00000001",
        cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
    )
    assert got == expected


def test_rfc7616_example_credentials_parse() -> None:
    value = (
        'Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", '
        'algorithm=SHA-256, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001, '
        'cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, '
        'response="753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1", '
        'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
    )
    creds = parse_credentials(value)
    assert creds.username == "Mufasa"
    assert creds.algorithm == "SHA-256"
    assert creds.nc_value == 1
    assert creds.qop == "auth"


def test_rfc2069_response_form() -> None:
    ha1 = compute_ha1("u", "r", "p")
    ha2 = hashlib.md5(b"REGISTER:sip:r").hexdigest()
    want = hashlib.md5(f"{ha1}:n:{ha2}".encode()).hexdigest()
    assert (
        compute_response(algorithm="MD5", ha1=ha1, nonce="n", method="REGISTER", uri="sip:r")
        == want
    )


# ---------------------------------------------------------------- challenges


def test_challenge_offers_sha256_then_md5_as_separate_values() -> None:
    server, _ = make_server()
    ch = server.challenge(100.0)
    assert ch.status == 401
    assert [n for n, _ in ch.headers] == ["WWW-Authenticate", "WWW-Authenticate"]
    parsed = [parse_challenge(v) for _, v in ch.headers]
    assert [c.algorithm for c in parsed] == ["SHA-256", "MD5"]
    assert all(c.qop == ("auth",) and c.realm == REALM and not c.stale for c in parsed)
    assert parsed[0].nonce == parsed[1].nonce
    # Lean: the nonce carries its own MAC, so no opaque value rides along (docs/security.md).
    assert parsed[0].opaque is None
    assert 'qop="auth"' in ch.headers[0][1]
    assert "algorithm=SHA-256" in ch.headers[0][1]


def test_proxy_challenge_is_407() -> None:
    server, _ = make_server(algorithms=("MD5",))
    ch = server.challenge(0.0, proxy=True)
    assert ch.status == 407
    assert [n for n, _ in ch.headers] == ["Proxy-Authenticate"]


def test_config_rejects_unknown_algorithm() -> None:
    with pytest.raises(ValueError):
        DigestConfig(realm="r", algorithms=("SHA-1",))
    with pytest.raises(ValueError):
        DigestConfig(realm="r", nonce_lifetime=0)


# ---------------------------------------------------------------- round trips


def round_trip(server: DigestServer, client: DigestClient, req: Request, now: float) -> object:
    first = server.verify(req, now)
    assert isinstance(first, AuthChallenge)
    assert first.reason == "no credentials for our realm"
    name, value = client.respond(challenge_response(first), req)
    assert name == "Authorization"
    return server.verify(with_header(req, name, value), now)


@pytest.mark.parametrize("algorithm", ["SHA-256", "MD5"])
def test_round_trip_each_algorithm(algorithm: str) -> None:
    server, _ = make_server(algorithms=(algorithm,))
    client = DigestClient("alice", "secret", source(3))
    result = round_trip(server, client, register(), 10.0)
    assert result == AuthOk("alice", REALM, algorithm)


def test_client_picks_first_offered_algorithm() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    req = register()
    ch = server.verify(req, 1.0)
    assert isinstance(ch, AuthChallenge)
    _, value = client.respond(challenge_response(ch), req)
    assert parse_credentials(value).algorithm == "SHA-256"


def test_md5_only_client_gets_in_through_second_challenge() -> None:
    server, _ = make_server()
    ch = server.challenge(1.0)
    # A client that cannot do SHA-256 answers the MD5 challenge.
    md5 = parse_challenge(ch.headers[1][1])
    ha1 = compute_ha1("alice", REALM, "secret", "MD5")
    resp = compute_response(
        algorithm="MD5",
        ha1=ha1,
        nonce=md5.nonce,
        method="REGISTER",
        uri="sip:example.org",
        qop="auth",
        nc="00000001",
        cnonce="abc",
    )
    value = format_auth_params(
        "Digest",
        [
            ("username", "alice"),
            ("realm", REALM),
            ("nonce", md5.nonce),
            ("uri", "sip:example.org"),
            ("response", resp),
            ("qop", "auth"),
            ("nc", "00000001"),
            ("cnonce", "abc"),
            ("opaque", md5.opaque or ""),
        ],
    )
    assert server.verify_value(value, "REGISTER", "sip:example.org", 2.0) == AuthOk(
        "alice", REALM, "MD5"
    )


def test_preemptive_reuse_counts_up_and_is_accepted() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    req = register()
    assert isinstance(round_trip(server, client, req, 1.0), AuthOk)
    for n in (2, 3):
        name, value = client.authorize("REGISTER", "sip:example.org")
        assert parse_credentials(value).nc == f"{n:08x}"
        assert isinstance(server.verify(with_header(req, name, value), 1.0 + n), AuthOk)


def test_preemptive_credentials_follow_the_last_challenge() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    assert client.preemptive("REGISTER", "sip:example.org") is None  # nothing seen yet
    assert isinstance(round_trip(server, client, register(), 1.0), AuthOk)
    got = client.preemptive("INVITE", "sip:broker@example.org")
    assert got is not None
    name, value = got
    assert (name, parse_credentials(value).nc) == ("Authorization", "00000002")
    invite = server.verify_value(value, "INVITE", "sip:broker@example.org", 2.0)
    assert invite == AuthOk("alice", REALM, "SHA-256")


def test_preemptive_credentials_refused_earn_one_retry_not_a_loop() -> None:
    """A server that refuses credentials sent ahead without saying stale (it lost
    the nonce): the client answers its fresh challenge once; a refusal of that
    answer is the password's, and the client gives up."""
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    assert isinstance(round_trip(server, client, register(), 1.0), AuthOk)
    name, value = client.authorize("REGISTER", "sip:example.org")
    ahead = with_header(register(), name, value)
    name, fresh = client.respond(challenge_response(server.challenge(2.0)), ahead)
    assert parse_credentials(fresh).nc == "00000001"
    retry = with_header(register(), name, fresh)
    with pytest.raises(AuthRejectedError):
        client.respond(challenge_response(server.challenge(2.0)), retry)
    # Refused credentials are not sent ahead again: the next request goes without.
    assert client.preemptive("REGISTER", "sip:example.org") is None


def test_ha1_store_and_unknown_user() -> None:
    store = MemoryCredentialStore()
    store.add_ha1("bob", REALM, "sha-256", compute_ha1("bob", REALM, "pw", "SHA-256"))
    assert store.ha1("bob", REALM, "SHA-256") == compute_ha1("bob", REALM, "pw", "SHA-256")
    assert store.ha1("bob", REALM, "MD5") is None
    assert store.ha1("carol", REALM, "MD5") is None
    assert store.ha1("bob", REALM, "SHA-1") is None
    with pytest.raises(ValueError):
        store.add_ha1("bob", REALM, "SHA-1", "00")
    server = DigestServer(DigestConfig(realm=REALM), store, source(1))
    ok = round_trip(server, DigestClient("bob", "pw", source(2)), register(), 5.0)
    assert ok == AuthOk("bob", REALM, "SHA-256")
    denied = round_trip(server, DigestClient("carol", "pw", source(2)), register(), 5.0)
    assert isinstance(denied, AuthChallenge)
    assert denied.reason == "wrong credentials"


# ---------------------------------------------------------------- failures


def test_wrong_password_rechallenges_and_client_gives_up() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "wrong", source(3))
    req = register()
    ch = server.verify(req, 1.0)
    assert isinstance(ch, AuthChallenge)
    name, value = client.respond(challenge_response(ch), req)
    retry = with_header(req, name, value)
    again = server.verify(retry, 1.0)
    assert isinstance(again, AuthChallenge)
    assert again.reason == "wrong credentials"
    assert not again.stale
    with pytest.raises(AuthRejectedError) as info:
        client.respond(challenge_response(again), retry)
    assert info.value.status == 401


def test_stale_nonce_gets_stale_true_and_client_retries() -> None:
    server, _ = make_server(nonce_lifetime=30.0)
    client = DigestClient("alice", "secret", source(3))
    req = register()
    assert isinstance(round_trip(server, client, req, 0.0), AuthOk)
    name, value = client.authorize("REGISTER", "sip:example.org")
    retry = with_header(req, name, value)
    stale = server.verify(retry, 31.0)
    assert isinstance(stale, AuthChallenge)
    assert stale.stale
    assert all("stale=true" in v for _, v in stale.headers)
    # stale=true means "your password was fine": the client may retry at once.
    name, value = client.respond(challenge_response(stale), retry)
    assert server.verify(with_header(req, name, value), 31.0) == AuthOk("alice", REALM, "SHA-256")


def test_stale_nonce_with_wrong_password_is_not_stale() -> None:
    server, _ = make_server(nonce_lifetime=30.0)
    ch = server.challenge(0.0)
    client = DigestClient("alice", "wrong", source(3))
    _, value = client.respond(challenge_response(ch), register())
    again = server.verify_value(value, "REGISTER", "sip:example.org", 100.0)
    assert isinstance(again, AuthChallenge)
    assert not again.stale


def test_replayed_nonce_count_is_rejected() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    req = register()
    ch = server.verify(req, 1.0)
    assert isinstance(ch, AuthChallenge)
    _, value = client.respond(challenge_response(ch), req)
    assert isinstance(server.verify_value(value, "REGISTER", "sip:example.org", 2.0), AuthOk)
    replay = server.verify_value(value, "REGISTER", "sip:example.org", 3.0)
    assert isinstance(replay, AuthChallenge)
    # Stale: the hash is right, only its count is spent (a client whose requests
    # crossed retries at once; a replayer cannot answer the fresh nonce).
    assert (replay.reason, replay.stale) == ("nonce-count replayed", True)
    # A lower count after a higher one is also a replay.
    _, v2 = client.authorize("REGISTER", "sip:example.org")
    _, v3 = client.authorize("REGISTER", "sip:example.org")
    assert isinstance(server.verify_value(v3, "REGISTER", "sip:example.org", 4.0), AuthOk)
    assert isinstance(server.verify_value(v2, "REGISTER", "sip:example.org", 4.0), AuthChallenge)


def test_nonce_table_is_bounded_and_evicted_nonces_never_count_as_fresh() -> None:
    server, _ = make_server(max_tracked_nonces=4)
    values = []
    for t in range(10):
        client = DigestClient("alice", "secret", source(t))
        ch = server.challenge(float(t))
        _, value = client.respond(challenge_response(ch), register())
        values.append(value)
        assert isinstance(server.verify_value(value, "REGISTER", "sip:example.org", 10.0), AuthOk)
        assert server.tracked_nonces <= 4
    # Replaying the oldest (evicted) one does not work.
    result = server.verify_value(values[0], "REGISTER", "sip:example.org", 11.0)
    assert isinstance(result, AuthChallenge)


def test_wrong_realm_is_ignored_then_rechallenged() -> None:
    server, store = make_server()
    store.add_password("alice", "other.org", "secret")
    other = DigestServer(DigestConfig(realm="other.org"), store, source(9))
    client = DigestClient("alice", "secret", source(3))
    req = register()
    ch = other.challenge(1.0)
    name, value = client.respond(challenge_response(ch), req)
    result = server.verify(with_header(req, name, value), 1.0)
    assert isinstance(result, AuthChallenge)
    assert result.reason == "no credentials for our realm"
    # Given directly, credentials for another realm are refused too.
    direct = server.verify_value(value, "REGISTER", "sip:example.org", 1.0)
    assert isinstance(direct, AuthChallenge)
    assert direct.reason == "credentials for another realm"


def test_forged_nonce_and_uri_mismatch() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    ch = server.challenge(1.0)
    _, value = client.respond(challenge_response(ch), register())
    creds = parse_credentials(value)
    # A nonce changed under the answer breaks the response: a wrong password, not stale.
    forged = value.replace(creds.nonce, "A" * 48)
    got = server.verify_value(forged, "REGISTER", "sip:example.org", 1.0)
    assert isinstance(got, AuthChallenge)
    assert (got.reason, got.stale) == ("wrong credentials", False)
    # The right password on a nonce this server never issued (another secret: a
    # restart, another node): stale, so the client retries at once on a fresh one.
    other_store = MemoryCredentialStore()
    other_store.add_password("alice", REALM, "secret")
    other_server = DigestServer(DigestConfig(realm=REALM), other_store, source(1))
    got = other_server.verify_value(value, "REGISTER", "sip:example.org", 1.0)
    assert isinstance(got, AuthChallenge)
    assert (got.reason, got.stale) == ("nonce not issued by us", True)
    sent = with_header(register(), "Authorization", value)
    _, again = client.respond(challenge_response(got), sent)
    assert isinstance(other_server.verify_value(again, "REGISTER", "sip:example.org", 1.0), AuthOk)
    with pytest.raises(AuthHeaderError):
        server.verify_value(value, "REGISTER", "sip:other.org", 1.0)
    # Same URI spelled differently (case of the scheme) is the same target.
    assert isinstance(server.verify_value(value, "REGISTER", "SIP:example.org", 1.0), AuthOk)
    # An opaque value a client adds of its own accord changes nothing.
    _, fresh = client.respond(challenge_response(server.challenge(1.0)), register())
    with_opaque = fresh + ', opaque="x"'
    assert isinstance(server.verify_value(with_opaque, "REGISTER", "sip:example.org", 1.0), AuthOk)


def test_wrong_method_fails() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    _, value = client.respond(challenge_response(server.challenge(1.0)), register())
    got = server.verify_value(value, "INVITE", "sip:example.org", 1.0)
    assert isinstance(got, AuthChallenge)
    assert got.reason == "wrong credentials"


def test_rfc2069_answers_only_when_allowed() -> None:
    for allowed in (False, True):
        server, _ = make_server(allow_rfc2069=allowed, algorithms=("MD5",))
        ch = parse_challenge(server.challenge(1.0).headers[0][1])
        ha1 = compute_ha1("alice", REALM, "secret")
        resp = compute_response(
            algorithm="MD5", ha1=ha1, nonce=ch.nonce, method="REGISTER", uri="sip:example.org"
        )
        value = (
            f'Digest username="alice", realm="{REALM}", nonce="{ch.nonce}", '
            f'uri="sip:example.org", response="{resp}", opaque="{ch.opaque}"'
        )
        got = server.verify_value(value, "REGISTER", "sip:example.org", 2.0)
        assert isinstance(got, AuthOk) is allowed
        if allowed:
            # Without a count, a nonce is good once.
            again = server.verify_value(value, "REGISTER", "sip:example.org", 2.0)
            assert isinstance(again, AuthChallenge)


def test_auth_int_only_is_refused() -> None:
    server, _ = make_server(algorithms=("MD5",))
    ch = parse_challenge(server.challenge(1.0).headers[0][1])
    ha1 = compute_ha1("alice", REALM, "secret")
    resp = compute_response(
        algorithm="MD5",
        ha1=ha1,
        nonce=ch.nonce,
        method="REGISTER",
        uri="sip:example.org",
        qop="auth-int",
        nc="00000001",
        cnonce="c",
    )
    value = (
        f'Digest username="alice", realm="{REALM}", nonce="{ch.nonce}", uri="sip:example.org", '
        f'response="{resp}", qop=auth-int, nc=00000001, cnonce="c", opaque="{ch.opaque}"'
    )
    got = server.verify_value(value, "REGISTER", "sip:example.org", 2.0)
    assert isinstance(got, AuthChallenge)
    # And a client offered only auth-int cannot answer.
    resp_msg = Response(401, "Unauthorized")
    resp_msg.headers.add("WWW-Authenticate", 'Digest realm="r", nonce="n", qop="auth-int"')
    with pytest.raises(AuthUnsupportedError):
        DigestClient("a", "b", source()).respond(resp_msg, register())


def test_client_skips_unusable_challenges() -> None:
    resp = Response(401, "Unauthorized")
    resp.headers.add("WWW-Authenticate", 'Basic realm="r"')
    resp.headers.add("WWW-Authenticate", 'Digest realm="r", nonce="n", algorithm=SHA-512-256')
    resp.headers.add("WWW-Authenticate", "Digest realm=")
    resp.headers.add("WWW-Authenticate", 'Digest realm="r", nonce="n", algorithm=md5, qop="auth"')
    name, value = DigestClient("a", "b", source()).respond(resp, register())
    assert name == "Authorization"
    creds = parse_credentials(value)
    assert (creds.algorithm, creds.qop, creds.nc) == ("MD5", "auth", "00000001")
    empty = Response(401, "Unauthorized")
    with pytest.raises(AuthUnsupportedError):
        DigestClient("a", "b", source()).respond(empty, register())
    with pytest.raises(AuthUnsupportedError):
        DigestClient("a", "b", source()).authorize("REGISTER", "sip:r")


def test_client_answers_qopless_challenge_and_proxy() -> None:
    resp = Response(407, "Proxy Authentication Required")
    resp.headers.add("Proxy-Authenticate", 'Digest realm="r", nonce="n"')
    name, value = DigestClient("a", "b", source()).respond(resp, register())
    assert name == "Proxy-Authorization"
    creds = parse_credentials(value)
    assert creds.qop is None and creds.nc == "" and creds.opaque is None
    want = compute_response(
        algorithm="MD5",
        ha1=compute_ha1("a", "r", "b"),
        nonce="n",
        method="REGISTER",
        uri="sip:example.org",
    )
    assert creds.response == want


def test_proxy_verify_reads_proxy_authorization() -> None:
    server, _ = make_server()
    client = DigestClient("alice", "secret", source(3))
    req = register()
    ch = server.verify(req, 1.0, proxy=True)
    assert isinstance(ch, AuthChallenge) and ch.status == 407
    name, value = client.respond(challenge_response(ch), req)
    assert name == "Proxy-Authorization"
    assert isinstance(server.verify(with_header(req, name, value), 1.0, proxy=True), AuthOk)


# ---------------------------------------------------------------- header grammar


def test_parse_auth_header_forms() -> None:
    scheme, params = parse_auth_header(
        'Digest  realm = "a \\"b\\"" ,, NONCE=abc,algorithm=MD5 , qop="auth,auth-int"'
    )
    assert scheme == "Digest"
    assert params == {"realm": 'a "b"', "nonce": "abc", "algorithm": "MD5", "qop": "auth,auth-int"}
    assert parse_challenge('Digest realm="r", nonce="n", qop="auth,auth-int"').qop == (
        "auth",
        "auth-int",
    )
    assert parse_challenge('Digest realm="r", nonce="n", stale=TRUE').stale


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "Digest realm",
        'Digest realm="r" nonce="n"',
        'Digest realm="r", realm="s"',
        'Digest realm="unterminated',
        "Digest realm=",
        "Digest =x",
        'Digest"realm="r"',
        'Digest realm="a\\',
    ],
)
def test_malformed_headers_raise_typed_error(value: str) -> None:
    with pytest.raises(AuthHeaderError):
        parse_auth_header(value)


@pytest.mark.parametrize(
    "value",
    [
        'Digest realm="r", nonce="n", uri="u", response="00"',
        'Digest username="a", realm="r", nonce="n", uri="u"',
        'Digest username="a", realm="r", nonce="n", uri="u", response="' + "0" * 32 + '", qop=auth',
        'Digest username="a", realm="r", nonce="n", uri="u", response="'
        + "0" * 32
        + '", qop=auth, nc=1, cnonce="c"',
        'Digest username="a", realm="r", nonce="n", uri="u", response="' + "g" * 32 + '"',
        'Digest username="a", realm="r", nonce="n", uri="u", response="'
        + "0" * 32
        + '", algorithm=SHA-1',
        'Basic username="a"',
    ],
)
def test_bad_credentials_raise_typed_error(value: str) -> None:
    with pytest.raises(AuthHeaderError):
        parse_credentials(value)


def test_malformed_authorization_in_request_raises_header_error() -> None:
    server, _ = make_server()
    req = register('Authorization: Digest realm="example.org", nonce=')
    with pytest.raises(AuthHeaderError) as info:
        server.verify(req, 1.0)
    assert info.value.status == 400


def test_challenge_needs_realm_and_nonce() -> None:
    with pytest.raises(AuthHeaderError):
        parse_challenge('Digest realm="r"')
    with pytest.raises(AuthUnsupportedError):
        parse_challenge('Basic realm="r"')


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120))
def test_fuzz_parsers_raise_only_auth_errors(text: str) -> None:
    for parse in (parse_auth_header, parse_challenge, parse_credentials):
        with contextlib.suppress(AuthError):
            parse(text)


_PIECES = st.sampled_from(
    [
        "Digest ",
        "realm",
        "=",
        '"',
        "\\",
        ",",
        " ",
        "nonce",
        "abc",
        "response",
        "qop",
        "auth",
        "nc",
        "00000001",
        "username",
        "uri",
        "\t",
        ";",
        "é",
        "algorithm",
        "MD5",
        "SHA-256",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=30).map("".join))
def test_fuzz_structured_inputs_and_server(text: str) -> None:
    server, _ = make_server()
    for parse in (parse_auth_header, parse_challenge, parse_credentials):
        with contextlib.suppress(AuthError):
            parse(text)
    try:
        result = server.verify_value(text, "REGISTER", "sip:example.org", 1.0)
    except AuthHeaderError:
        return
    assert isinstance(result, AuthChallenge)


@settings(max_examples=100, deadline=None)
@given(
    user=st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20),
    password=st.text(max_size=20),
    algorithm=st.sampled_from(["MD5", "SHA-256"]),
)
def test_round_trip_any_username(user: str, password: str, algorithm: str) -> None:
    store = MemoryCredentialStore()
    store.add_password(user, REALM, password)
    server = DigestServer(DigestConfig(realm=REALM, algorithms=(algorithm,)), store, source(1))
    client = DigestClient(user, password, source(2))
    assert round_trip(server, client, register(), 0.0) == AuthOk(user, REALM, algorithm)
