"""Users and their digest credentials (RFC 3261 section 22, RFC 8760 for SHA-256).

Only HA1 = H(username ":" realm ":" password) is stored, once per algorithm, never the
password: the registrar's digest check needs nothing else. The ``-sess`` variants start
from the same HA1, so ``get_credentials`` answers them too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from mdeci.store._sql import reading, transaction
from mdeci.store.errors import DuplicateUser, InvalidArgument, StoreError, UnsupportedAlgorithm
from mdeci.store.models import UserRow

_CHUNK = 1000  # URIs bound in one IN list: far below either database's parameter limit


@dataclass(frozen=True, slots=True)
class User:
    """A user of the broker: its AOR and the digest username and realm it logs in with."""

    uri: str
    username: str
    realm: str


def ha1(algorithm: str, username: str, realm: str, password: str) -> str:
    """HA1 hex digest ``H(username:realm:password)`` for ``MD5`` or ``SHA-256``.

    Raises:
        UnsupportedAlgorithm: the algorithm is neither MD5 nor SHA-256 (nor a -sess form).
    """
    data = f"{username}:{realm}:{password}".encode()
    if _column(algorithm) == "md5":
        return hashlib.md5(data, usedforsecurity=False).hexdigest()
    return hashlib.sha256(data).hexdigest()


def username_of(uri: str) -> str:
    """The user part of a SIP URI: ``sip:alice@example.com`` gives ``alice``.

    Raises:
        InvalidArgument: the URI has no user part.
    """
    rest = uri.split(":", 1)[1] if ":" in uri else uri
    user, at, _host = rest.partition("@")
    if not at or not user:
        raise InvalidArgument(f"URI {uri!r} has no user part; pass username= explicitly")
    return user.split(";", 1)[0]


# The HA1 of one user by algorithm family, built once: every Digest check reads one.
_HA1 = {
    family: select(column).where(
        UserRow.username == bindparam("username"), UserRow.realm == bindparam("realm")
    )
    for family, column in (("md5", UserRow.ha1_md5), ("sha256", UserRow.ha1_sha256))
}


def _column(algorithm: str) -> str:
    name = algorithm.upper()
    name = name.removesuffix("-SESS")
    if name == "MD5":
        return "md5"
    if name == "SHA-256":
        return "sha256"
    raise UnsupportedAlgorithm(f"no HA1 kept for digest algorithm {algorithm!r}")


class SqlUserStore:
    """Users and credentials in SQL; every method is one committed transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def add_user(
        self,
        uri: str,
        realm: str,
        password: str,
        *,
        username: str | None = None,
        md5: bool = False,
    ) -> User:
        """Add a user, computing its SHA-256 HA1 (and its MD5 HA1 only with ``md5``: an
        explicit opt-in, an unsalted MD5 of the password is weak) from the password.

        ``username`` defaults to the user part of ``uri``.

        Raises:
            DuplicateUser: the URI, or the username in that realm, exists already.
            InvalidArgument: no username given and the URI has no user part.
            StoreError: the database failed.
        """
        name = username if username is not None else username_of(uri)
        return self.add_user_ha1(
            uri,
            realm,
            ha1_md5=ha1("MD5", name, realm, password) if md5 else "",
            ha1_sha256=ha1("SHA-256", name, realm, password),
            username=name,
        )

    def add_user_ha1(
        self,
        uri: str,
        realm: str,
        *,
        ha1_md5: str,
        ha1_sha256: str,
        username: str | None = None,
    ) -> User:
        """Add a user from precomputed HA1 hex digests (e.g. imported from another server).

        Raises:
            DuplicateUser: the URI, or the username in that realm, exists already.
            InvalidArgument: no username given and the URI has no user part.
            StoreError: the database failed.
        """
        name = username if username is not None else username_of(uri)
        row = {
            "uri": uri,
            "username": name,
            "realm": realm,
            "ha1_md5": ha1_md5.lower(),
            "ha1_sha256": ha1_sha256.lower(),
        }
        try:
            with transaction(self._engine, "add_user") as conn:
                conn.execute(insert(UserRow).values(row))
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                raise DuplicateUser(f"user {uri!r} ({name}@{realm}) exists already") from exc
            raise
        return User(uri=uri, username=name, realm=realm)

    def set_password(self, uri: str, password: str, *, md5: bool = False) -> bool:
        """Replace a user's HA1s from a new plaintext password (MD5 only with ``md5``,
        else cleared); False if no such user.

        Raises:
            StoreError: the database failed.
        """
        user = self.get_user(uri)
        if user is None:
            return False
        # username and realm never change, so reading them first cannot race.
        with transaction(self._engine, "set_password") as conn:
            result = conn.execute(
                update(UserRow)
                .where(UserRow.uri == uri)
                .values(
                    ha1_md5=ha1("MD5", user.username, user.realm, password) if md5 else "",
                    ha1_sha256=ha1("SHA-256", user.username, user.realm, password),
                )
            )
        return bool(result.rowcount)

    def remove_user(self, uri: str) -> bool:
        """Delete a user; True if it existed. Its queue, subscriptions and session stay.

        Raises:
            StoreError: the database failed.
        """
        with transaction(self._engine, "remove_user") as conn:
            result = conn.execute(delete(UserRow).where(UserRow.uri == uri))
        return bool(result.rowcount)

    def get_user(self, uri: str) -> User | None:
        """The user with this URI, or None.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "get_user") as conn:
            row = conn.execute(
                select(UserRow.uri, UserRow.username, UserRow.realm).where(UserRow.uri == uri)
            ).one_or_none()
        return None if row is None else User(*row)

    def known(self, uris: Sequence[str]) -> set[str]:
        """Which of ``uris`` are users: one query per thousand (a broker checks every
        configured user at each start).

        Raises:
            StoreError: the database failed.
        """
        found: set[str] = set()
        with reading(self._engine, "known_users") as conn:
            for i in range(0, len(uris), _CHUNK):
                chunk = list(uris[i : i + _CHUNK])
                found.update(
                    conn.execute(select(UserRow.uri).where(UserRow.uri.in_(chunk))).scalars()
                )
        return found

    def get_credentials(self, username: str, realm: str, algorithm: str) -> str | None:
        """The HA1 hex digest for ``username`` in ``realm``, or None if there is no such user
        (or none is kept for that algorithm: MD5 is stored only on opt-in).

        ``algorithm`` is the digest challenge's: ``MD5``, ``SHA-256`` or their ``-sess``
        forms (case-insensitive).

        Raises:
            UnsupportedAlgorithm: an algorithm other than those.
            StoreError: the database failed.
        """
        stmt = _HA1[_column(algorithm)]
        with reading(self._engine, "get_credentials") as conn:
            value = conn.execute(stmt, {"username": username, "realm": realm}).scalar_one_or_none()
        return value or None  # "" = not kept

    def credentials_of(
        self, usernames: Sequence[str], realm: str, algorithms: Sequence[str]
    ) -> dict[tuple[str, str], str | None]:
        """:meth:`get_credentials` of each of ``usernames`` for each of ``algorithms``,
        keyed (username, algorithm), None where there is none (also for an algorithm
        no HA1 is kept for): one query per thousand users (a restarted broker reads its
        sessions' owners all at once).

        Raises:
            StoreError: the database failed.
        """
        families: dict[str, str | None] = {}
        for algorithm in algorithms:
            try:
                families[algorithm] = _column(algorithm)
            except UnsupportedAlgorithm:
                families[algorithm] = None
        rows: dict[str, dict[str, str | None]] = {}
        with reading(self._engine, "credentials_of") as conn:
            for i in range(0, len(usernames), _CHUNK):
                chunk = list(usernames[i : i + _CHUNK])
                for username, md5, sha256 in conn.execute(
                    select(UserRow.username, UserRow.ha1_md5, UserRow.ha1_sha256).where(
                        UserRow.username.in_(chunk), UserRow.realm == realm
                    )
                ):
                    rows[username] = {"md5": md5, "sha256": sha256}
        return {
            (username, algorithm): rows.get(username, {}).get(family or "") or None  # "": not kept
            for username in usernames
            for algorithm, family in families.items()
        }

    def list_users(self) -> list[User]:
        """Every user, ordered by URI.

        Raises:
            StoreError: the database failed.
        """
        with reading(self._engine, "list_users") as conn:
            rows = conn.execute(
                select(UserRow.uri, UserRow.username, UserRow.realm).order_by(UserRow.uri)
            ).all()
        return [User(*row) for row in rows]
