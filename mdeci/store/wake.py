"""Wake-ups between brokers on one PostgreSQL database: LISTEN/NOTIFY.

A publish queues rows for its recipients wherever their sessions are held. In the same
transaction it sends one notification per recipient held by another broker node
(:data:`NOTIFY_OTHERS`, run by :meth:`~mdeci.store.queues.SqlQueueStore.publish_many`);
PostgreSQL delivers it at commit, and only then, to every session listening on the
store's channel. The payload is the recipient's URI; each broker keeps the ones it
holds. The channel is named after the schema (``mdeci_queued_<schema>``), so stores in
other schemas of the same database do not hear each other. A change of a subscription
(added, removed, renewed) is told the same way on ``mdeci_subs_<schema>``, with the
node that made it: the other brokers read the subscriptions again for their matchers.

A wake-up is a hint: one missed (the listener was reconnecting, a notification queue
overflowed) is repaired by the broker's periodic sweep, which reads every user's queue
again. SQLite has one broker and needs none.

:func:`listen` is blocking: the broker runs it on a thread of its own, on a dedicated
connection (a pooled one would be handed to other work between notifications).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
from psycopg import sql
from sqlalchemy.engine import URL

CHANNEL_PREFIX = "mdeci_queued_"
NOTIFY_OTHERS = (
    f"SELECT pg_notify('{CHANNEL_PREFIX}' || current_schema(), s.uri) FROM sessions s "
    "WHERE s.uri = ANY(%s::text[]) AND s.owner <> '' AND s.owner <> %s"
)
# A subscription added, removed or renewed: the payload is the node that changed it.
SUBS_PREFIX = "mdeci_subs_"
NOTIFY_SUBSCRIPTIONS = f"SELECT pg_notify('{SUBS_PREFIX}' || current_schema(), %s)"
# How long one wait for notifications lasts, seconds: the longest a stop waits.
POLL = 0.5


def conninfo(url: URL) -> str:
    """The libpq connection string of a SQLAlchemy ``postgresql+psycopg`` URL."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def listen(
    url: URL,
    on_wake: Callable[[str], None],
    on_listening: Callable[[], None],
    stop: threading.Event,
    *,
    on_subscriptions: Callable[[str], None] | None = None,
    retry: float = 1.0,
) -> None:
    """Until ``stop`` is set: connect to ``url``, LISTEN on its store's channels, then
    call ``on_listening()`` (whatever changed while not listening is found by reading
    the queues and subscriptions again), ``on_wake(uri)`` for each user woken and
    ``on_subscriptions(node)`` for each change of the subscriptions by broker ``node``.
    A lost connection is made again after ``retry`` seconds."""
    while not stop.is_set():
        try:
            with psycopg.connect(conninfo(url), autocommit=True) as conn:
                row = conn.execute("SELECT current_schema()").fetchone()
                schema = "" if row is None else str(row[0])
                for prefix in (CHANNEL_PREFIX, SUBS_PREFIX):
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(prefix + schema)))
                on_listening()
                while not stop.is_set():
                    for note in conn.notifies(timeout=POLL):
                        if note.channel.startswith(CHANNEL_PREFIX):
                            on_wake(note.payload)
                        elif on_subscriptions is not None:
                            on_subscriptions(note.payload)
        except psycopg.Error:
            stop.wait(retry)
