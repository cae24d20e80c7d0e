"""Each device's weekly calendar of channel availability, as it sent it.

One row per user: the rules of its last ``calendar`` frame, CBOR-encoded (a list of
``{channel, p, weekdays, start_hour, end_hour}`` maps, with ``start_at`` and ``end_at``
for a dated rule; docs/frames.md), its UTC offset
and when it arrived. The broker's selector reads it once per user and keeps it; a new
frame replaces the row. Migration: ``migrations/versions/0005c.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cbor2
from sqlalchemy import Float, Integer, LargeBinary, String, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Mapped, Session, mapped_column

from mdeci.channels.calendar import Rule, WeeklyCalendar
from mdeci.store.base import Base
from mdeci.store.errors import StoreError


class DeviceCalendar(Base):
    """The last calendar a user's device sent."""

    __tablename__ = "device_calendars"

    user_uri: Mapped[str] = mapped_column(String(255), primary_key=True)
    rules_cbor: Mapped[bytes] = mapped_column(LargeBinary)
    utc_offset_minutes: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[float] = mapped_column(Float)


@dataclass(frozen=True, slots=True)
class StoredCalendar:
    rules: tuple[Rule, ...]
    utc_offset_minutes: int
    updated_at: float

    def calendar(self) -> WeeklyCalendar:
        return WeeklyCalendar.from_rules(self.rules, utc_offset_minutes=self.utc_offset_minutes)


def _rules_cbor(rules: tuple[Rule, ...]) -> bytes:
    maps: list[dict[str, object]] = []
    for r in rules:
        m: dict[str, object] = {
            "channel": r.channel,
            "p": r.p,
            "weekdays": sorted(r.weekdays),
            "start_hour": r.start_hour,
            "end_hour": r.end_hour,
        }
        if r.start_at is not None:  # a dated rule
            m["start_at"], m["end_at"] = r.start_at, r.end_at
        maps.append(m)
    return cbor2.dumps(maps)


class SqlCalendars:
    """Devices' calendars in SQL: one short transaction per call."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def put(self, uri: str, rules: tuple[Rule, ...], utc_offset_minutes: int, at: float) -> None:
        """Keep ``rules`` as ``uri``'s calendar (replacing any older one).

        Raises:
            StoreError: the database failed.
        """
        try:
            with Session(self._engine) as session, session.begin():
                session.merge(
                    DeviceCalendar(
                        user_uri=uri,
                        rules_cbor=_rules_cbor(rules),
                        utc_offset_minutes=utc_offset_minutes,
                        updated_at=at,
                    )
                )
        except SQLAlchemyError as exc:
            raise StoreError(f"calendar of {uri}: {exc}") from exc

    def get(self, uri: str) -> StoredCalendar | None:
        """``uri``'s calendar, or None if its device never sent one.

        Raises:
            StoreError: the database failed.
        """
        try:
            with Session(self._engine) as session:
                row = session.scalars(
                    select(DeviceCalendar).where(DeviceCalendar.user_uri == uri)
                ).first()
                if row is None:
                    return None
                raw = cbor2.loads(row.rules_cbor)
                rules = tuple(
                    Rule(
                        channel=r["channel"],
                        p=r["p"],
                        weekdays=frozenset(r["weekdays"]),
                        start_hour=r["start_hour"],
                        end_hour=r["end_hour"],
                        start_at=r.get("start_at"),
                        end_at=r.get("end_at"),
                    )
                    for r in raw
                )
                return StoredCalendar(rules, row.utc_offset_minutes, row.updated_at)
        except SQLAlchemyError as exc:
            raise StoreError(f"calendar of {uri}: {exc}") from exc
