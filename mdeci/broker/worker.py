"""The broker's database thread: every call into the core and the store, off the event loop.

Theory of operation
-------------------
The store is synchronous (SQLAlchemy); a slow or hung database (a lock held by another
connection, a network stall up to the store's statement timeout) would stop every SIP
transaction and RUDP timer of the process if its calls ran on the event loop.
So the asyncio glue (:mod:`mdeci.broker.service`, :mod:`mdeci.broker.endpoint`) never
calls the store or :class:`~mdeci.broker.glue.Broker` itself: it hands each call to ONE
:class:`DbWorker` thread and awaits the result (:meth:`DbWorker.run`), or only queues
it when nothing waits for the answer (:meth:`DbWorker.post`).

One thread, first in first out, is what keeps the core's rules without a lock:

- the core stays single-threaded and sans-IO: only this thread runs it once a service
  owns it (:meth:`Broker.bind_thread` makes any other caller fail loudly);
- calls run in the order the loop made them, so the loop's order of events is the
  core's: a ``mark_connected`` posted before a ``take_batch`` runs before it, a
  publish's ``pub-ok`` is built after its commit and sent after the call returned,
  an ack held by the core is applied before a later read of the queue;
- a task cancelled while its call runs (a delivery task stopped by a disconnection)
  loses only the answer: the state change it made is undone by the call that caused
  the cancellation, queued behind it (``mark_connected`` / ``mark_disconnected`` reset
  the window; what was taken and not sent is sent again from the lowest un-acked nseq).

What the core tells the loop (``QueueListener`` calls, churn events) arrives on this
thread and is handed back with ``call_soon_threadsafe`` (:class:`LoopSink`), in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar

from mdeci.broker.db_health import DatabaseHealth
from mdeci.broker.sink import ChurnSink, FieldValue, Row, fields_emitter, rows_emitter
from mdeci.store.errors import StoreError

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger("mdeci.broker")
# Calls of LoopSink.emit_rows merged into one pass down the chain, at most.
MERGE_LIMIT = 1024


class DbWorker:
    """One thread running the broker's core and store calls in submission order.

    A queue and a thread of its own rather than a one-thread ``ThreadPoolExecutor``: a
    call's round trip then costs the loop one queue put and one ``call_soon_threadsafe``
    back, where the executor's future, locks and chained callbacks cost about twice as
    much of both threads (every SIP set-up makes several calls). The thread is a daemon:
    the broker closes it on every way out (:meth:`close` runs what was queued); a process
    that ends without closing it loses the queued calls, as a crash would.
    """

    def __init__(self, name: str = "mdeci-db") -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._closed = False
        self._last: _Batch[Any] | None = None  # the batch queued last, if nothing came after
        self._thread = threading.Thread(target=self._serve, name=f"{name}_0", daemon=True)
        self._thread.start()
        assert self._thread.ident is not None
        self.thread_id: int = self._thread.ident
        #: Where :meth:`post`'s calls report (the broker's; the service sets it).
        self.health = DatabaseHealth()

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the worker thread; its result or its exception.

        Cancelling the caller does not stop a call already running (see the module
        docstring for why that is safe for the broker's calls). Raises RuntimeError
        once :meth:`close` was called.
        """
        if self._closed:
            raise RuntimeError("the database thread is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._last = None
        self._calls.put(_Call(functools.partial(fn, *args, **kwargs), loop, future))
        return await future

    def post(self, what: str, fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        """Queue ``fn(*args, **kwargs)`` behind every call made so far; nobody waits.

        A :class:`StoreError` goes to :attr:`health` with ``where=what`` (the write is
        one the next change repeats, e.g. a session status); any other error is logged
        with its traceback.
        """
        if self._closed:
            return
        call = functools.partial(_logged, self.health, what, functools.partial(fn, *args, **kwargs))
        self._last = None
        self._calls.put(_Call(call, None, None))

    def post_batch(self, what: str, fn: Callable[[list[T]], object], item: T) -> None:
        """Queue ``fn([item])`` as :meth:`post` does; or, when the call queued last is a
        batch of ``fn``'s that has not started, add ``item`` to its list.

        While the thread is behind, consecutive writes then share one call (one
        transaction, one commit) without any call moving past another: a batch takes
        only what was queued after it and before anything else. Called on one thread
        (the event loop's), as :meth:`run` and :meth:`post` are.
        """
        if self._closed:
            return
        last = self._last
        if last is not None and last.fn == fn and last.add(item):
            return
        batch = _Batch(fn, item)
        self._last = batch
        call = functools.partial(_logged, self.health, what, batch.run)
        self._calls.put(_Call(call, None, None))

    def on_thread(self) -> bool:
        """True when called from the worker thread."""
        return threading.get_ident() == self.thread_id

    def close(self) -> None:
        """Run what was queued, then stop the thread (idempotent)."""
        if not self._closed:
            self._closed = True
            self._calls.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                result: object = call.fn()
            except BaseException as exc:  # handed to the caller, as an executor would
                call.answer(None, exc)
            else:
                call.answer(result, None)


class _Call:
    """One queued call; ``loop`` and ``future`` are None for a posted one."""

    __slots__ = ("fn", "future", "loop")

    def __init__(
        self,
        fn: Callable[[], Any],
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[Any] | None,
    ) -> None:
        self.fn = fn
        self.loop = loop
        self.future = future

    def answer(self, result: object, exc: BaseException | None) -> None:
        """Hand the outcome to the caller's loop (worker thread)."""
        if self.loop is None or self.future is None:
            return  # a posted call: it reported its own errors (_logged)
        # The loop may be gone (the broker stopped while the call ran): nobody waits.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(_settle, self.future, result, exc)


class _Batch(Generic[T]):
    """The items of one :meth:`DbWorker.post_batch` call; closed once it starts."""

    __slots__ = ("fn", "items", "lock")

    def __init__(self, fn: Callable[[list[T]], object], item: T) -> None:
        self.fn = fn
        self.items: list[T] | None = [item]
        self.lock = threading.Lock()  # the loop adds while the worker may start it

    def add(self, item: T) -> bool:
        """Add ``item`` unless the batch has started; whether it was added."""
        with self.lock:
            if self.items is None:
                return False
            self.items.append(item)
            return True

    def run(self) -> None:
        with self.lock:
            items, self.items = self.items, None
        assert items is not None  # run once
        self.fn(items)


def _settle(future: asyncio.Future[Any], result: object, exc: BaseException | None) -> None:
    if future.done():
        return  # the caller was cancelled: it loses only the answer
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


def _logged(health: DatabaseHealth, what: str, call: Callable[[], object]) -> None:
    try:
        call()
    except StoreError as exc:
        health.failed(what, exc)
    except Exception:
        log.exception("%s failed on the database thread", what)


class LoopQueue:
    """Calls made from any thread, run on the event loop in the order they were made.

    One loop wake-up per burst, not per call: a drain calls back once per ack.
    Built on the loop's thread; a call made on that thread runs at once (after what the
    worker queued earlier, to keep the order).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._pending: deque[tuple[Callable[..., object], tuple[object, ...]]] = deque()
        self._scheduled = False

    def call(self, fn: Callable[..., object], *args: object) -> None:
        if threading.get_ident() == self._loop_thread:
            self._flush()
            fn(*args)
            return
        # No lock (two churn events per notification each took one): deque.append is
        # atomic, and the flag is only a hint. The worker appends BEFORE it reads the
        # flag, and _flush clears it BEFORE it empties the deque, so a call either sees
        # the flag clear and schedules a flush, or was appended before that flush began
        # emptying the deque and is run by it. At worst a flush finds nothing to do.
        self._pending.append((fn, args))
        if self._scheduled:
            return
        self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
            self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        pending = self._pending
        while pending:
            fn, args = pending.popleft()
            fn(*args)

    def take_next(self, fn: Callable[..., object]) -> tuple[object, ...] | None:
        """On the loop, from a call being run: the arguments of the next call queued if
        it is a call of ``fn`` (it is then taken off the queue, the caller does its work),
        else None. Lets a call merge with the ones queued right behind it (the churn
        rows of consecutive acks) without changing the order of anything. The worker
        only ever appends at the other end, and only the loop takes: no lock needed."""
        pending = self._pending
        if pending and pending[0][0] is fn:
            return pending.popleft()[1]
        return None


class LoopSink:
    """A :class:`ChurnSink` that may be called from any thread and writes to ``sink`` on
    the event loop, in call order (the churn log and the metrics are the loop's)."""

    def __init__(self, sink: ChurnSink, queue: LoopQueue) -> None:
        self.sink = sink
        self._queue = queue
        self._emit_fields = fields_emitter(sink)  # the fields go on as one mapping
        self._emit_rows = rows_emitter(sink)
        # One bound method for good: LoopQueue.take_next recognises its calls by identity.
        self._on_loop = self._rows_on_loop

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        self._queue.call(self._emit_fields, event, uri, fields)

    def emit_rows(self, event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
        """Events handed over together (``sink.emit_rows``): one call on the loop, merged
        there with the rows of the same event queued right behind it (a round of acks
        logs one row per ack: one pass down the chain and one write for them all)."""
        self._queue.call(self._on_loop, event, keys, rows)

    def _rows_on_loop(self, event: str, keys: tuple[str, ...], rows: Sequence[Row]) -> None:
        merged: list[Row] | None = None
        for _ in range(MERGE_LIMIT):  # bounded: the worker may be appending still
            more = self._queue.take_next(self._on_loop)
            if more is None:
                break
            if more[0] != event or more[1] != keys:
                # Another event: this batch goes first, then that one with its followers.
                self._emit_rows(event, keys, merged if merged is not None else rows)
                event, keys, rows = more  # type: ignore[assignment]
                merged = None
                continue
            if merged is None:
                merged = list(rows)
            merged += more[2]  # type: ignore[arg-type]
        self._emit_rows(event, keys, merged if merged is not None else rows)
