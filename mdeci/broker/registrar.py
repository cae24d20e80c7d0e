"""The broker's embedded registrar: the sans-IO :class:`~sip.registrar.Registrar` over the
SQL bindings, run from the event loop without calling the database there.

:class:`StoreBindings` is :class:`sip.registrar.BindingStore` over ``BrokerStore.bindings``
(on the database thread). :class:`StagedBindings` lets the registrar run on the event
loop over the rows of one AOR read beforehand: its writes are recorded, then applied on
the database thread before the answer goes out (a failure answers 500 and logs no
event). :class:`BrokerRegistrar` handles REGISTERs so, one at a time (no two stage the
same rows), except one without credentials for our realm: the registrar authenticates
before it reads a binding (RFC 3261 §10.3 steps 3-4 before 7-8), so such a REGISTER is
refused (challenged, or 400 for unreadable credentials) at once, with no store read and
no wait behind other REGISTERs' commits; a binding read there would raise StoreError,
never answer from no rows. It logs the registrar's events as the churn events
``registered`` / ``unregistered`` / ``registration_expired``, and runs the expiry sweep.
Binding expiries are wall-clock epoch seconds: they are stored, and outlive the process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from mdeci.broker.addresses import addr_text
from mdeci.broker.sink import ChurnSink
from mdeci.broker.worker import DbWorker
from mdeci.store.bindings import Binding as StoredBinding
from mdeci.store.errors import StoreError
from mdeci.store.repo import BrokerStore
from sip.aio.ua import IncomingRequest, Reply
from sip.auth import Verifier
from sip.errors import SipParseError
from sip.registrar import (
    Binding,
    Registered,
    Registrar,
    RegistrarEvent,
    RegistrationExpired,
    Unregistered,
)
from sip.uri import SipUri


class StoreBindings:
    """:class:`sip.registrar.BindingStore` over ``BrokerStore.bindings`` (SQL)."""

    def __init__(self, store: BrokerStore) -> None:
        self._bindings = store.bindings

    @staticmethod
    def _out(b: StoredBinding) -> Binding:
        return Binding(b.aor, b.contact, b.expires_at, b.call_id, b.cseq, b.q, b.source)

    def bindings(self, aor: str, now: float) -> list[Binding]:
        return [self._out(b) for b in self._bindings.bindings(aor, now)]

    def put(self, binding: Binding) -> None:
        b = binding
        self._bindings.put(
            StoredBinding(b.aor, b.contact, b.expires_at, b.call_id, b.cseq, b.q, b.source)
        )

    def remove(self, aor: str, contact: str) -> None:
        self._bindings.remove(aor, contact)

    def remove_all(self, aor: str) -> None:
        self._bindings.remove_all(aor)

    def expire(self, now: float) -> list[Binding]:
        return [self._out(b) for b in self._bindings.expire(now)]


class StagedBindings:
    """:class:`sip.registrar.BindingStore` over rows read beforehand: the registrar runs
    on the loop, its writes are recorded and applied later on the database thread.

    :meth:`begin` gives the bindings of the one AOR the next REGISTER may touch; any
    other AOR reads as unavailable (StoreError: the REGISTER gets 500).
    """

    def __init__(self) -> None:
        self._aor: str | None = None
        self._rows: dict[str, Binding] = {}
        self._ops: list[tuple[str, Binding | str]] = []

    def begin(self, aor: str | None, rows: list[Binding]) -> None:
        self._aor = aor
        self._rows = {b.contact: b for b in rows}
        self._ops = []

    def end(self) -> list[tuple[str, Binding | str]]:
        """The writes recorded since :meth:`begin`, in order; forgets the rows."""
        ops, self._ops = self._ops, []
        self._aor, self._rows = None, {}
        return ops

    def _check(self, aor: str) -> None:
        if aor != self._aor:
            raise StoreError(f"bindings of {aor} were not read before the request")

    def bindings(self, aor: str, now: float) -> list[Binding]:
        self._check(aor)
        live = [b for b in self._rows.values() if b.expires_at > now]
        return sorted(live, key=lambda b: -b.q)

    def put(self, binding: Binding) -> None:
        self._check(binding.aor)
        self._rows[binding.contact] = binding
        self._ops.append(("put", binding))

    def remove(self, aor: str, contact: str) -> None:
        self._check(aor)
        self._rows.pop(contact, None)
        self._ops.append(("remove", contact))

    def remove_all(self, aor: str) -> None:
        self._check(aor)
        self._rows.clear()
        self._ops.append(("remove_all", aor))

    def expire(self, now: float) -> list[Binding]:
        raise StoreError("expiry runs on the database thread, not through staged rows")

    @staticmethod
    def apply(store: StoreBindings, aor: str, ops: list[tuple[str, Binding | str]]) -> None:
        """Write ``ops`` (database thread). Raises StoreError."""
        for op, arg in ops:
            if op == "put":
                assert isinstance(arg, Binding)
                store.put(arg)
            elif op == "remove":
                assert isinstance(arg, str)
                store.remove(aor, arg)
            else:
                store.remove_all(aor)


class BrokerRegistrar:
    """Runs ``registrar`` (over ``staged``) for REGISTERs, on the loop; see the module
    docstring. ``clock``: wall-clock epoch seconds."""

    def __init__(
        self,
        registrar: Registrar,
        staged: StagedBindings,
        store: BrokerStore,
        worker: DbWorker,
        log: ChurnSink,
        clock: Callable[[], float],
    ) -> None:
        self.registrar = registrar
        self._staged = staged
        self._store = store
        self._worker = worker
        self._log = log
        self._clock = clock
        self._lock = asyncio.Lock()

    async def handle(self, req: IncomingRequest, auth: Verifier, *, credentials: bool) -> Reply:
        """The answer to a REGISTER, its Digest checked by ``auth`` (bound to this
        request); ``credentials``: whether it carries credentials for our realm. Raises
        StoreError (nothing stored, nothing logged)."""
        if not credentials:
            return self._refused(req, auth)
        try:
            to = req.request.to.uri
            aor = to.aor if isinstance(to, SipUri) and to.user is not None else None
        except SipParseError:
            aor = None  # the registrar refuses it before any binding is read
        bindings = StoreBindings(self._store)
        async with self._lock:
            now = self._clock()
            rows = [] if aor is None else await self._worker.run(bindings.bindings, aor, now)
            self._staged.begin(aor, rows)
            response = self.registrar.handle(
                req.request, now, source=addr_text(req.source), auth=auth
            )
            ops = self._staged.end()
            try:
                if ops and aor is not None:
                    await self._worker.run(StagedBindings.apply, bindings, aor, ops)
            except BaseException:
                while self.registrar.next_event() is not None:
                    pass  # nothing was stored: nothing to log
                raise
        while (event := self.registrar.next_event()) is not None:
            self._emit(event)
        return Reply.from_response(response)

    def _refused(self, req: IncomingRequest, auth: Verifier) -> Reply:
        """The answer to a REGISTER that cannot authenticate: staged with no AOR, so a
        binding read or write (none is due) raises StoreError."""
        self._staged.begin(None, [])
        try:
            response = self.registrar.handle(
                req.request, self._clock(), source=addr_text(req.source), auth=auth
            )
        finally:
            self._staged.end()
        return Reply.from_response(response)

    def _emit(self, event: RegistrarEvent) -> None:
        if isinstance(event, Registered):
            if not event.refreshed:
                self._log.emit(
                    "registered",
                    event.aor,
                    call_id=event.call_id or None,
                    addr=event.source,
                    reason=f"contact={event.contact} expires={event.expires}",
                )
        elif isinstance(event, Unregistered):
            self._log.emit(
                "unregistered",
                event.aor,
                call_id=event.call_id or None,
                reason=f"contact={event.contact}",
            )
        elif isinstance(event, RegistrationExpired):
            self._log.emit(
                "registration_expired",
                event.aor,
                addr=event.source,
                reason=f"contact={event.contact}",
            )

    async def expire_now(self) -> int:
        """Run the binding expiry sweep once; how many bindings ran out. Raises StoreError."""
        gone = await self._worker.run(StoreBindings(self._store).expire, self._clock())
        for b in gone:
            self._emit(RegistrationExpired(b.aor, b.contact, b.source))
        return len(gone)

    async def sweep_forever(self, interval: float) -> None:
        """:meth:`expire_now` every ``interval`` seconds (a failure: at the next one)."""
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(StoreError):
                await self.expire_now()
