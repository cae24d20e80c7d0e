"""``BrokerStore``: the broker's whole durable state behind one object.

Each attribute is a repository over the same engine; every method of every repository
is one committed transaction, so a ``kill -9`` after a call returns loses nothing.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from mdeci.store.bindings import SqlBindingStore
from mdeci.store.identity import SqlStoreIdentity
from mdeci.store.ownership import SqlOwnership
from mdeci.store.queues import SqlQueueStore
from mdeci.store.sessions import SqlSessionStore
from mdeci.store.subscriptions import SqlSubscriptionStore
from mdeci.store.users import SqlUserStore


class BrokerStore:
    """Users, bindings, sessions, subscriptions and queues over one engine.

    ``node`` names the broker that uses this handle: the owner of the sessions it stores
    and the holder its fenced calls (``ownership``) speak for. The schema must exist
    already (``mdeci db upgrade``, Alembic head). The caller owns the engine
    (``mdeci.store.base.make_engine``) and disposes of it.
    """

    def __init__(self, engine: Engine, node: str = "") -> None:
        self.engine = engine
        self.node = node  # the broker node this handle writes as (sessions.owner)
        self.users = SqlUserStore(engine)
        self.bindings = SqlBindingStore(engine)
        self.sessions = SqlSessionStore(engine)
        self.subscriptions = SqlSubscriptionStore(engine)
        self.subscriptions.node = node
        self.queues = SqlQueueStore(engine)
        self.queues.node = node
        self.identity = SqlStoreIdentity(engine)
        self.ownership = SqlOwnership(engine, node)
