"""Users and digest credentials."""

from __future__ import annotations

import hashlib
import os

import pytest
from sqlalchemy.engine import Engine

from mdeci.store.base import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS, make_engine
from mdeci.store.errors import DuplicateUser, InvalidArgument, StoreError, UnsupportedAlgorithm
from mdeci.store.users import SqlUserStore, User, ha1, username_of
from tests.peers import missing


def test_ha1_matches_rfc_definition() -> None:
    assert (
        ha1("MD5", "alice", "example.com", "pw") == hashlib.md5(b"alice:example.com:pw").hexdigest()
    )
    assert (
        ha1("SHA-256", "alice", "example.com", "pw")
        == hashlib.sha256(b"alice:example.com:pw").hexdigest()
    )
    # RFC 2617 section 3.5 example: Mufasa / testrealm@host.com / Circle Of Life.
    assert ha1("MD5", "Mufasa", "testrealm@host.com", "Circle Of Life") == (
        "939e7578ed9e3c518a452acee763bce9"
    )


def test_username_of() -> None:
    assert username_of("sip:alice@example.com") == "alice"
    assert username_of("sips:bob;x=1@example.com") == "bob"
    with pytest.raises(InvalidArgument):
        username_of("sip:example.com")


def test_add_get_credentials_list(engine: Engine) -> None:
    users = SqlUserStore(engine)
    alice = users.add_user("sip:alice@example.com", "example.com", "secret", md5=True)
    assert alice == User("sip:alice@example.com", "alice", "example.com")
    users.add_user_ha1(
        "sip:bob@example.com",
        "example.com",
        ha1_md5="AB" * 16,
        ha1_sha256="cd" * 32,
        username="bobby",
    )
    assert users.get_credentials("alice", "example.com", "MD5") == ha1(
        "MD5", "alice", "example.com", "secret"
    )
    assert users.get_credentials("alice", "example.com", "sha-256") == ha1(
        "SHA-256", "alice", "example.com", "secret"
    )
    assert users.get_credentials("alice", "example.com", "SHA-256-sess") == ha1(
        "SHA-256", "alice", "example.com", "secret"
    )
    assert users.get_credentials("bobby", "example.com", "MD5") == "ab" * 16
    assert users.get_credentials("alice", "other.org", "MD5") is None
    assert users.get_credentials("nobody", "example.com", "MD5") is None
    with pytest.raises(UnsupportedAlgorithm):
        users.get_credentials("alice", "example.com", "SHA-512-256")
    assert [u.uri for u in users.list_users()] == ["sip:alice@example.com", "sip:bob@example.com"]
    assert users.get_user("sip:bob@example.com") == User(
        "sip:bob@example.com", "bobby", "example.com"
    )
    assert users.get_user("sip:carol@example.com") is None


def test_known_tells_which_uris_are_users_in_one_pass(engine: Engine) -> None:
    users = SqlUserStore(engine)
    users.add_user("sip:alice@example.com", "example.com", "secret")
    users.add_user("sip:u1499@example.com", "example.com", "secret")
    asked = [f"sip:u{i}@example.com" for i in range(1500)] + ["sip:alice@example.com"]
    assert users.known(asked) == {"sip:alice@example.com", "sip:u1499@example.com"}
    assert users.known([]) == set()


def test_credentials_of_many_users_are_each_ones_credentials(engine: Engine) -> None:
    users = SqlUserStore(engine)
    users.add_user("sip:alice@example.com", "example.com", "secret", md5=True)
    users.add_user("sip:u1499@example.com", "example.com", "other")
    users.add_user("sip:bob@elsewhere.org", "elsewhere.org", "secret")
    names = [f"u{i}" for i in range(1500)] + ["alice", "bob"]
    algorithms = ["MD5", "SHA-256", "SHA-256-sess"]
    found = users.credentials_of(names, "example.com", algorithms)
    assert found == {
        (name, a): users.get_credentials(name, "example.com", a)
        for name in names
        for a in algorithms
    }
    assert found[("alice", "MD5")] is not None and found[("u1499", "MD5")] is None
    assert users.credentials_of(["alice"], "example.com", ["SHA-512"]) == {
        ("alice", "SHA-512"): None
    }


def test_duplicate_user_is_refused(engine: Engine) -> None:
    users = SqlUserStore(engine)
    users.add_user("sip:alice@example.com", "example.com", "a", md5=True)
    with pytest.raises(DuplicateUser):
        users.add_user("sip:alice@example.com", "example.com", "b")
    # Same username in the same realm under another URI: digest could not tell them apart.
    with pytest.raises(DuplicateUser):
        users.add_user("sip:alice@other.example.com", "example.com", "c")
    assert issubclass(DuplicateUser, StoreError)
    assert users.get_credentials("alice", "example.com", "MD5") == ha1(
        "MD5", "alice", "example.com", "a"
    )


def test_set_password_and_remove(engine: Engine) -> None:
    users = SqlUserStore(engine)
    users.add_user("sip:alice@example.com", "example.com", "old")
    assert users.set_password("sip:alice@example.com", "new", md5=True)
    assert users.get_credentials("alice", "example.com", "MD5") == ha1(
        "MD5", "alice", "example.com", "new"
    )
    assert users.set_password("sip:alice@example.com", "newer")  # MD5 HA1 cleared
    assert users.get_credentials("alice", "example.com", "MD5") is None
    assert not users.set_password("sip:nobody@example.com", "x")
    assert users.remove_user("sip:alice@example.com")
    assert not users.remove_user("sip:alice@example.com")
    assert users.list_users() == []


def test_md5_ha1_is_kept_only_on_opt_in(engine: Engine) -> None:
    """Only SHA-256 is stored (and offered) by default; MD5 only on opt-in."""
    users = SqlUserStore(engine)
    users.add_user("sip:alice@example.com", "example.com", "secret")
    assert users.get_credentials("alice", "example.com", "MD5") is None
    assert users.get_credentials("alice", "example.com", "SHA-256") == ha1(
        "SHA-256", "alice", "example.com", "secret"
    )


def test_a_postgresql_url_keeps_its_own_options() -> None:
    """connect_args replace the URL's query arguments: the operator's ``options`` (here a
    search_path) survive next to the statement timeout."""
    url = os.environ.get("MDECI_TEST_PG_URL")
    if not url:
        missing("PostgreSQL", "export MDECI_TEST_PG_URL=postgresql+psycopg://...")
    sep = "&" if "?" in url else "?"
    engine = make_engine(f"{url}{sep}options=-csearch_path%3Dmdeci_opts_probe,public")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW search_path").scalar() == "mdeci_opts_probe,public"
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() != "0"
            idle = conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
            assert idle == f"{PG_IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}s"
    finally:
        engine.dispose()
