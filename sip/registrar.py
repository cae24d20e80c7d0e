"""Registrar and location service (RFC 3261 §10.3), sans-IO.

Theory of operation: :meth:`Registrar.handle` takes one REGISTER (already
parsed, and already matched to its server transaction) and the time, and
returns the final response to send. It walks the steps of RFC 3261 §10.3 in
order; the first step that fails decides the answer and nothing is stored
(step 7: all binding changes of a request are committed together or not at
all). Bindings live behind the :class:`BindingStore` port (in memory here,
SQL in ``mdeci/store``). What changed is reported as events the embedding
application pulls with :meth:`Registrar.next_event` (for the churn log):
:class:`Registered`, :class:`Unregistered`, :class:`RegistrationExpired`.
:meth:`Registrar.expire` removes bindings whose time is up (call it
periodically); :meth:`Registrar.lookup` is the location service.

The steps and their answers (table, §10.3):

====  ======================================================  ===========
step  check                                                   failure
====  ======================================================  ===========
 -    method is REGISTER                                      405 + Allow
 -    headers readable (To, CSeq, Contact, Expires)           400
 1    Request-URI is a SIP URI of one of our domains          404
 2    no Require option we do not support (§8.2.2.3)         420 + Unsupported
 3    Digest credentials valid (§22), if auth is configured   401 / 400
 4    authenticated user owns the To AOR                      403
 5    To is a SIP AOR of that domain                          404
 6    ``Contact: *`` only alone and with ``Expires: 0``       400
 6    each non-zero expiry at least ``min_expires``           423 + Min-Expires
 7    same Call-ID needs a higher CSeq than the binding's     500 + Warning
 -    at most ``max_bindings`` per AOR                        403 + Warning
 8    200 with every current binding and its ``expires``      (success)
====  ======================================================  ===========

Step 7 says an out-of-order REGISTER "fails" without naming a status; we
answer 500 (the status §10.3 uses for a failed commit in the same step)
with a Warning that says why, rather than dropping it: a client that sees
no answer would retransmit until Timer F, and a reordered stale REGISTER is
no error worth a 32-second wait.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sip.auth import AuthChallenge, Verifier
from sip.errors import AuthHeaderError, SipParseError
from sip.headers import is_token, quote
from sip.message import Request, Response, make_response
from sip.uri import NameAddr, SipUri, Via, format_hostport

__all__ = [
    "Binding",
    "BindingStore",
    "ContactSpec",
    "MemoryBindingStore",
    "Outcome",
    "Registered",
    "Registrar",
    "RegistrarConfig",
    "RegistrarEvent",
    "RegistrationExpired",
    "Unregistered",
    "normalize_aor",
]

# RFC 3261 §20.19: an expiry is at most 2**32-1 seconds.
MAX_DELTA_SECONDS = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Binding:
    """One AOR-to-contact binding (§10.3). ``expires_at`` uses the caller's clock."""

    aor: str  # "sip:alice@example.org"
    contact: str  # the Contact URI text, e.g. "sip:alice@127.0.0.2:5062;transport=udp"
    expires_at: float  # absolute, same clock as `now`
    call_id: str
    cseq: int
    q: float = 1.0
    source: str | None = None  # "ip:port" the REGISTER came from, for NAT/rport (may be None)


class BindingStore(Protocol):
    """Where bindings live. Keyed by (aor, contact); the registrar does the rules."""

    def bindings(self, aor: str, now: float) -> list[Binding]:
        """Unexpired bindings of ``aor`` (any order)."""
        ...

    def put(self, binding: Binding) -> None:
        """Insert or replace the binding with that (aor, contact)."""
        ...

    def remove(self, aor: str, contact: str) -> None:
        """Delete one binding (no error if absent)."""
        ...

    def remove_all(self, aor: str) -> None:
        """Delete every binding of ``aor``."""
        ...

    def expire(self, now: float) -> list[Binding]:
        """Delete and return the bindings with ``expires_at <= now``."""
        ...


class MemoryBindingStore:
    """A :class:`BindingStore` in a dict, for tests and the embedded default.

    Expiry times also sit in a heap, so the registrar's once-a-second sweep costs what
    expires, not a walk over every binding (a registrar holds hundreds of thousands);
    entries of bindings refreshed or removed since are skipped when they come up."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, Binding]] = {}
        self._deadlines: list[tuple[float, str, str]] = []
        self._count = 0

    def bindings(self, aor: str, now: float) -> list[Binding]:
        """Unexpired bindings of ``aor``, in insertion order."""
        contacts = self._data.get(aor)
        if contacts is None:
            return []
        return [b for b in contacts.values() if b.expires_at > now]

    def put(self, binding: Binding) -> None:
        """Insert or replace by (aor, contact)."""
        aor, contact = binding.aor, binding.contact
        contacts = self._data.get(aor)
        if contacts is None:
            contacts = self._data[aor] = {}
        if contact not in contacts:
            self._count += 1
        contacts[contact] = binding
        heapq.heappush(self._deadlines, (binding.expires_at, aor, contact))
        if len(self._deadlines) > 2 * self._count + 1024:
            # Mostly stale entries (frequent refreshes): rebuild from the live bindings.
            self._deadlines = [
                (b.expires_at, b.aor, b.contact) for c in self._data.values() for b in c.values()
            ]
            heapq.heapify(self._deadlines)

    def remove(self, aor: str, contact: str) -> None:
        """Delete one binding if present."""
        contacts = self._data.get(aor)
        if contacts is not None and contacts.pop(contact, None) is not None:
            self._count -= 1
            if not contacts:
                del self._data[aor]

    def remove_all(self, aor: str) -> None:
        """Delete every binding of ``aor``."""
        self._count -= len(self._data.pop(aor, {}))

    def expire(self, now: float) -> list[Binding]:
        """Delete and return the expired bindings."""
        gone: list[Binding] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            expires_at, aor, contact = heapq.heappop(heap)
            contacts = self._data.get(aor)
            binding = contacts.get(contact) if contacts is not None else None
            if contacts is None or binding is None or binding.expires_at != expires_at:
                continue  # refreshed or removed since this entry was pushed
            gone.append(binding)
            self.remove(aor, contact)
        return gone


# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Registered:
    """A binding was added (``refreshed`` False) or refreshed/updated (True)."""

    aor: str
    contact: str
    expires: int
    source: str | None = None
    call_id: str = ""
    refreshed: bool = False


@dataclass(frozen=True, slots=True)
class Unregistered:
    """The client removed a binding (``Expires: 0`` or ``Contact: *``)."""

    aor: str
    contact: str
    call_id: str = ""


@dataclass(frozen=True, slots=True)
class RegistrationExpired:
    """A binding ran out without refresh (found by :meth:`Registrar.expire`)."""

    aor: str
    contact: str
    source: str | None = None


RegistrarEvent = Registered | Unregistered | RegistrationExpired


# ---------------------------------------------------------------- config


@dataclass(frozen=True, kw_only=True, slots=True)
class RegistrarConfig:
    """Registrar settings.

    ``domains``: the domains we hold bindings for (Request-URI and To host);
    ``default_expires``: used when neither the contact's ``expires`` nor an
    Expires header says (§10.3 step 6; RFC default 3600, the mdeci agent
    asks for 600 itself); ``min_expires``: shorter non-zero requests get 423
    (at most 3600: §10.3 only lets us refuse intervals under an hour);
    ``max_expires``: longer requests are shortened to it; ``max_bindings``:
    contacts per AOR, more get 403; ``warn_agent``: the warn-agent of our
    Warning headers (§20.43).
    """

    domains: tuple[str, ...]
    default_expires: int = 3600
    min_expires: int = 60
    max_expires: int = 86400
    max_bindings: int = 16
    warn_agent: str = "mdeci"

    def __post_init__(self) -> None:
        if not self.domains:
            raise ValueError("a registrar needs at least one domain")
        if not 0 < self.min_expires <= 3600:
            raise ValueError("min_expires must be in 1..3600 (RFC 3261 §10.3 step 6)")
        if not self.min_expires <= self.default_expires <= self.max_expires:
            raise ValueError("need min_expires <= default_expires <= max_expires")
        if self.max_bindings < 1:
            raise ValueError("max_bindings must be positive")
        if not is_token(self.warn_agent):
            raise ValueError("warn_agent must be a token")


def _listing_order(b: Binding) -> tuple[float, float]:
    """Highest ``q`` first; among equals, the binding that expires last."""
    return (-b.q, -b.expires_at)


def normalize_aor(uri: str) -> str:
    """``sip:user@host`` (host lower-cased, no port or params) of a SIP URI text.

    Raises :class:`SipParseError` if ``uri`` is not a SIP/SIPS URI.
    """
    return SipUri.parse(uri).aor


@dataclass(frozen=True, slots=True)
class Outcome:
    """The registrar's answer without the headers copied from the request: a status
    and the headers to add (Contact lines of a 200, Warning, Min-Expires, ...)."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()


ContactSpec = tuple[str, int | None, float]
"""One Contact already read: (URI text as ``str(SipUri)`` prints it, its ``expires``
parameter or None, its ``q``)."""


class _Reject(Exception):
    """Internal: a step failed; carries the answer."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.status)
        self.outcome = outcome


# One contact to apply: (URI text, expiry in seconds, q).
_Contact = tuple[str, int, float]


class Registrar:
    """The REGISTER handler of one or more domains (RFC 3261 §10.3).

    ``random`` gives To tags (§8.2.6.2); ``auth``, when given, makes every
    REGISTER prove its user with Digest (§22) and lets a user touch only its
    own AOR. :meth:`handle` may be given a verifier for that one request (one bound
    to the request's source, say) in place of ``auth``. With ``events`` False,
    :meth:`next_event` has nothing to give: for an embedder that reads none.
    """

    def __init__(
        self,
        config: RegistrarConfig,
        store: BindingStore,
        random: Callable[[int], bytes],
        *,
        auth: Verifier | None = None,
        events: bool = True,
    ) -> None:
        self.config = config
        self._store = store
        self._random = random
        self._auth = auth
        self._domains = {d.lower() for d in config.domains}
        self._events: deque[RegistrarEvent] = deque()
        # Without a reader of the events (a quiet registrar) none is made at all.
        self._record = events

    @property
    def random(self) -> Callable[[int], bytes]:
        """The source of random bytes the To tags come from."""
        return self._random

    # ------------------------------------------------------------ outputs

    def next_event(self) -> RegistrarEvent | None:
        """The oldest event not yet pulled, or None."""
        return self._events.popleft() if self._events else None

    def lookup(self, aor: str, now: float) -> list[Binding]:
        """Current bindings of ``aor`` for routing, highest ``q`` first.

        Ties go to the binding that expires last (usually the freshest
        REGISTER, i.e. the device's newest address). ``aor`` may be any SIP
        URI of the user (it is normalized); other text is looked up as is.
        """
        try:
            key = normalize_aor(aor)
        except SipParseError:
            key = aor
        return sorted(self._store.bindings(key, now), key=_listing_order)

    def expire(self, now: float) -> list[Binding]:
        """Remove bindings whose time is up; one :class:`RegistrationExpired` each."""
        gone = self._store.expire(now)
        if self._record:
            for b in gone:
                self._events.append(RegistrationExpired(b.aor, b.contact, b.source))
        return gone

    # ------------------------------------------------------------ input

    def handle(
        self,
        request: Request,
        now: float,
        *,
        source: str | None = None,
        auth: Verifier | None = None,
    ) -> Response:
        """Process a REGISTER and return the final response (never raises).

        ``source`` is the ``ip:port`` it came from; when None it is taken
        from the top Via's ``received``/``rport`` if the transport stamped
        them (§18.2.1, RFC 3581). ``auth`` verifies this request in place of
        the registrar's own verifier. See the module table for every answer.
        """
        try:
            outcome = self._handle(request, now, source, auth or self._auth)
        except _Reject as reject:
            outcome = reject.outcome
        resp = make_response(request, outcome.status, to_tag=self.new_tag())
        for name, value in outcome.headers:
            resp.headers.add(name, value)
        return resp

    def new_tag(self) -> str:
        """A fresh To tag (§8.2.6.2)."""
        return self._random(8).hex()

    def register(
        self,
        aor: str,
        call_id: str,
        cseq: int,
        contacts: list[ContactSpec],
        expires_header: int | None,
        now: float,
        *,
        source: str | None = None,
    ) -> Outcome:
        """Steps 6-8 for a REGISTER whose steps 1-5 passed and whose Contacts were read
        (none: a query; ``Contact: *`` is not for here). The fast path's entry point;
        :meth:`handle` ends in the same code. Never raises."""
        try:
            return self._bind(aor, call_id, cseq, contacts, expires_header, now, source)
        except _Reject as reject:
            return reject.outcome

    def _reject(
        self, status: int, warning: str | None = None, headers: tuple[tuple[str, str], ...] = ()
    ) -> _Reject:
        if warning is not None:
            # §20.43: 399 is "miscellaneous warning", for free text like ours.
            headers = (*headers, ("Warning", f"399 {self.config.warn_agent} {quote(warning)}"))
        return _Reject(Outcome(status, headers))

    def _handle(
        self, req: Request, now: float, source: str | None, auth: Verifier | None
    ) -> Outcome:
        if req.method != "REGISTER":
            raise self._reject(405, headers=(("Allow", "REGISTER"),))
        try:
            to = req.to
            cseq = req.cseq.seq
            contacts_raw = req.headers.get_all("Contact")
            expires_header = self._expires_header(req)
            request_uri = req.parsed_uri
            via_source = self._via_source(req) if source is None else source
        except SipParseError as exc:
            raise self._reject(400, f"bad request: {exc.reason}") from None

        # Step 1: is this registrar responsible for the Request-URI's domain?
        if not isinstance(request_uri, SipUri) or request_uri.host.lower() not in self._domains:
            raise self._reject(404, "domain not served here")
        # Step 2: §8.2.2.3, we support no extension that needs Require.
        required = [v.strip() for v in req.headers.get_all("Require") if v.strip()]
        if required:
            raise self._reject(420, headers=(("Unsupported", ", ".join(required)),))
        # Step 5 (checked before 3-4 so authorization has an AOR to compare):
        # To must be an AOR of a domain we serve. The Request-URI may name the domain
        # or one of its aliases (our own address, as phones often send it), so the
        # two hosts need not be equal; both must be ours.
        aor_uri = to.uri
        if (
            not isinstance(aor_uri, SipUri)
            or aor_uri.user is None
            or aor_uri.host.lower() not in self._domains
        ):
            raise self._reject(404, "To is not an address-of-record of this domain")
        aor = aor_uri.aor
        # Steps 3-4: authenticate (§22) and authorize: only the owner of an
        # AOR may change or read its bindings (docs/protocol.md §2).
        if auth is not None:
            try:
                result = auth.verify(req, now)
            except AuthHeaderError as exc:
                raise self._reject(400, f"bad credentials: {exc.reason}") from None
            if isinstance(result, AuthChallenge):
                raise _Reject(Outcome(result.status, tuple(result.headers)))
            if result.username != aor_uri.user:
                raise self._reject(403, f"{result.username} may not register {aor}")

        call_id = req.call_id
        if any(v.strip() == "*" for v in contacts_raw):
            return self._unbind_all(aor, call_id, cseq, len(contacts_raw), expires_header, now)
        contacts: list[ContactSpec] = []
        for value in contacts_raw:
            try:
                contact = NameAddr.parse(value)
                contacts.append((str(contact.uri), contact.expires, contact.q))
            except SipParseError as exc:
                raise self._reject(400, f"bad Contact: {exc.reason}") from None
        return self._bind(aor, call_id, cseq, contacts, expires_header, now, via_source)

    def _bind(
        self,
        aor: str,
        call_id: str,
        cseq: int,
        contacts: list[ContactSpec],
        expires_header: int | None,
        now: float,
        source: str | None,
    ) -> Outcome:
        found = self._store.bindings(aor, now)
        current = {b.contact: b for b in found} if found else {}
        if contacts:
            current = self._update(
                now, aor, current, self._contacts(contacts, expires_header), call_id, cseq,
                source,
            )  # fmt: skip
        return self._listing(current, now)

    @staticmethod
    def _listing(current: dict[str, Binding], now: float) -> Outcome:
        # Step 8: 200 listing every current binding with its remaining time.
        bindings = list(current.values())
        if len(bindings) > 1:
            bindings.sort(key=_listing_order)
        lines: list[tuple[str, str]] = []
        for b in bindings:
            # Round up, but not for float noise (now + 600 - now may be 600.0000001).
            remaining = max(1, math.ceil(b.expires_at - now - 1e-6))
            q = "" if b.q == 1.0 else f";q={b.q:g}"
            lines.append(("Contact", f"<{b.contact}>;expires={remaining}{q}"))
        return Outcome(200, tuple(lines))

    @staticmethod
    def _expires_header(req: Request) -> int | None:
        value = req.headers.get("Expires")
        if value is None:
            return None
        if not value.isdigit() or not value.isascii():
            raise SipParseError(0, f"bad Expires {value[:20]!r}")
        return min(int(value), MAX_DELTA_SECONDS)

    @staticmethod
    def _via_source(req: Request) -> str | None:
        try:
            via: Via = req.top_via
        except SipParseError:
            return None
        if via.received is None and via.rport is None:
            return None
        host, port = via.response_address()
        return format_hostport(host, port)

    def _contacts(self, contacts: list[ContactSpec], expires_header: int | None) -> list[_Contact]:
        config = self.config
        out: dict[str, _Contact] = {}
        for uri, param, q in contacts:
            expires = param if param is not None else expires_header
            if expires is None:
                expires = config.default_expires
            expires = min(expires, MAX_DELTA_SECONDS)
            # Step 6: refuse too-short intervals (423) rather than lengthen
            # them silently; the client retries with Min-Expires.
            if 0 < expires < config.min_expires:
                raise self._reject(423, headers=(("Min-Expires", str(config.min_expires)),))
            # The same contact twice in one request: the last one wins.
            out[uri] = (uri, min(expires, config.max_expires), q)
        return list(out.values())

    def _unbind_all(
        self,
        aor: str,
        call_id: str,
        cseq: int,
        contact_count: int,
        expires_header: int | None,
        now: float,
    ) -> Outcome:
        # Step 6: "Contact: *" removes every binding, only alone and with Expires: 0.
        if contact_count != 1 or expires_header != 0:
            raise self._reject(400, "Contact: * needs Expires: 0 and no other Contact")
        current = self._store.bindings(aor, now)
        if any(b.call_id == call_id and cseq <= b.cseq for b in current):
            raise self._reject(500, "CSeq not higher than that of a binding")
        self._store.remove_all(aor)
        if self._record:
            for b in current:
                self._events.append(Unregistered(aor, b.contact, call_id))
        return Outcome(200)

    def _update(
        self,
        now: float,
        aor: str,
        current: dict[str, Binding],
        contacts: list[_Contact],
        call_id: str,
        cseq: int,
        source: str | None,
    ) -> dict[str, Binding]:
        """Apply the contacts (all or nothing, step 7); the bindings after the change."""
        # Plan every change first: §10.3 step 7 commits all or nothing.
        puts: list[tuple[Binding, bool]] = []
        removes: list[str] = []
        for uri, expires, q in contacts:
            existing = current.get(uri)
            # Step 7: same Call-ID needs a higher CSeq, else the update fails.
            if existing is not None and existing.call_id == call_id and cseq <= existing.cseq:
                raise self._reject(500, f"CSeq not higher than that of binding {uri}")
            if expires == 0:
                if existing is not None:
                    removes.append(uri)
                continue
            binding = Binding(aor, uri, now + expires, call_id, cseq, q, source)
            puts.append((binding, existing is not None))
        after = dict(current) if current else {}
        for uri in removes:
            del after[uri]
        for binding, _ in puts:
            after[binding.contact] = binding
        if len(after) > self.config.max_bindings:
            raise self._reject(403, f"more than {self.config.max_bindings} contacts")
        store, events, record = self._store, self._events, self._record
        for uri in removes:
            store.remove(aor, uri)
            if record:
                events.append(Unregistered(aor, uri, call_id))
        for binding, refreshed in puts:
            store.put(binding)
            if record:
                expires = round(binding.expires_at - now)
                events.append(Registered(aor, binding.contact, expires, source, call_id, refreshed))
        return after
