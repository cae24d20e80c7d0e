"""Show the demo as it runs: a ``rich`` live panel on a terminal, plain lines otherwise.

The story calls :meth:`View.show` a few times a second with a :class:`Snapshot` and
:meth:`View.note` for each step (a move, the outage); the view decides what to print.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

PLAIN_EVERY = 2.0  # seconds between two progress lines without a terminal


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the demo looks like now."""

    elapsed: float
    phase: str
    broker_sees_alice: str  # CONNECTED / DISCONNECTED, the broker's view of alice's media
    alice_status: str  # the agent's own view
    alice_addr: str  # alice's media address (host:port)
    published: int
    matched: int
    delivered: int
    queue_depth: int
    last_event: str


class View(Protocol):
    def start(self) -> None: ...
    def show(self, snap: Snapshot) -> None: ...
    def note(self, elapsed: float, text: str) -> None: ...
    def stop(self) -> None: ...


class PlainView:
    """Progress lines for pipes and CI: every step, and a status line every 2 s."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self._last = -PLAIN_EVERY

    def start(self) -> None:
        pass

    def show(self, snap: Snapshot) -> None:
        if snap.phase == "starting" or snap.elapsed - self._last < PLAIN_EVERY:
            return
        self._last = snap.elapsed
        self._line(
            snap.elapsed,
            f"broker sees alice {snap.broker_sees_alice}; alice at {snap.alice_addr};"
            f" published {snap.published} matched {snap.matched} delivered {snap.delivered}"
            f" queued {snap.queue_depth}",
        )

    def note(self, elapsed: float, text: str) -> None:
        self._line(elapsed, text)

    def stop(self) -> None:
        self.out.flush()

    def _line(self, elapsed: float, text: str) -> None:
        print(f"[{elapsed:6.2f} s] {text}", file=self.out, flush=True)


class LiveView:
    """A ``rich`` Live panel: alice's state, the counters, the last steps."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.notes: list[str] = []
        self._snap: Snapshot | None = None
        self._live = Live(self._render(), console=console, refresh_per_second=8, transient=False)

    def start(self) -> None:
        self._live.start()

    def show(self, snap: Snapshot) -> None:
        self._snap = snap
        self._live.update(self._render())

    def note(self, elapsed: float, text: str) -> None:
        self.notes.append(f"[{elapsed:6.2f} s] {text}")
        self._live.update(self._render())

    def stop(self) -> None:
        self._live.stop()

    def _render(self) -> Panel:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        s = self._snap
        if s is None:
            table.add_row("starting", "broker, alice and bob")
        else:
            colour = "green" if s.broker_sees_alice == "CONNECTED" else "red"
            table.add_row("phase", s.phase)
            table.add_row("alice (broker's view)", Text(s.broker_sees_alice, style=colour))
            table.add_row("alice (agent's view)", s.alice_status)
            table.add_row("alice's media address", s.alice_addr)
            table.add_row("published by bob", str(s.published))
            table.add_row("matched (expected)", str(s.matched))
            table.add_row("delivered to alice", str(s.delivered))
            table.add_row("queued for alice", str(s.queue_depth))
            table.add_row("last notification", s.last_event or "-")
        steps = Text("\n".join(self.notes[-8:]), style="dim")
        elapsed = 0.0 if s is None else s.elapsed
        title = f"mdeci demo: {elapsed:5.1f} s"
        return Panel(Group(table, Text(""), steps), title=title, expand=False)


def make_view(out: IO[str], *, live: bool | None = None) -> View:
    """A live view when ``out`` is a terminal (or ``live`` says so), else plain lines."""
    console = Console(file=out)
    if live is None:
        live = console.is_terminal
    return LiveView(console) if live else PlainView(out)
