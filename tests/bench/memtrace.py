"""Run a module under tracemalloc; each SIGUSR1 writes a snapshot (benchmarks only).

``python -m tests.bench.memtrace OUT_PREFIX -m mdeci broker ...`` runs ``mdeci`` as
``__main__``. The first SIGUSR1 starts tracemalloc (``MEMTRACE_FRAMES`` frames, default
10: started after start-up, the snapshots hold what was allocated since, e.g. the
sessions, and start-up is not slowed); each later one writes ``OUT_PREFIX.<n>.snap``.
SIGUSR2 counts the objects the garbage collector tracks by type (no tracing needed);
the next SIGUSR2 prints the types that grew since (``memtrace census '<table>'``).
Each prints ``memtrace <what>`` on stdout, so the benchmark reads that line instead of
waiting on a file. ``python -m tests.bench.memtrace
--top SNAP [N]`` prints the top N allocation sites grouped by traceback and by line.
"""

from __future__ import annotations

import contextlib
import gc
import os
import runpy
import signal
import sys
import tracemalloc
from collections import Counter, deque
from types import FrameType

NOISE = (tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen *>"))


def top(path: str, count: int = 25) -> str:
    """The ``count`` biggest sites of a snapshot, by line and by traceback (4 frames)."""
    snap = tracemalloc.Snapshot.load(path).filter_traces(NOISE)
    total = sum(s.size for s in snap.statistics("filename"))
    out = [f"total traced {total / 1024 / 1024:.1f} MiB", "", "by line:"]
    for stat in snap.statistics("lineno")[:count]:
        frame = stat.traceback[0]
        out.append(f"{stat.size / 1024:10.0f} KiB {stat.count:8d}  {frame.filename}:{frame.lineno}")
    out += ["", "by traceback (innermost last):"]
    for stat in snap.statistics("traceback")[:count]:
        out.append(f"{stat.size / 1024:10.0f} KiB {stat.count:8d}")
        for frame in list(stat.traceback)[-4:]:
            out.append(f"        {frame.filename}:{frame.lineno}")
    return "\n".join(out)


def types_in_use() -> Counter[str]:
    """Bytes (``sys.getsizeof``, shallow) of the objects the collector tracks, by type,
    with ``#type`` keys holding their counts."""
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        sizes[name] += sys.getsizeof(obj)
        sizes["#" + name] += 1
        # Containers are named by where they are kept too ("dict in Dialog.routes"):
        # "dict" alone does not say whose state grew.
        for attr, value in _attributes(obj):
            if type(value) in (dict, list, set, deque):
                where = f"{type(value).__qualname__} in {name}.{attr}"
                sizes[where] += sys.getsizeof(value)
                sizes["#" + where] += 1
    return sizes


def _attributes(obj: object) -> list[tuple[str, object]]:
    """An instance's attributes: its ``__dict__`` and its slots."""
    out: list[tuple[str, object]] = []
    if type(obj) in (dict, list, tuple, set, deque) or isinstance(obj, type):
        return out
    with contextlib.suppress(AttributeError, TypeError):
        # Not vars(): it may run a class's __getattr__.
        out.extend(object.__getattribute__(obj, "__dict__").items())
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            # The slot's own descriptor: getattr may run a class's __getattr__.
            descriptor = cls.__dict__.get(slot)
            if slot not in ("__dict__", "__weakref__") and descriptor is not None:
                with contextlib.suppress(AttributeError):  # an empty slot
                    out.append((slot, descriptor.__get__(obj, cls)))
    return out


def census_text(now: Counter[str], before: Counter[str], count: int = 50) -> str:
    """The types that grew most between two censuses."""
    grown = [(now[k] - before[k], k) for k in now if not k.startswith("#")]
    grown.sort(reverse=True)
    rows = [
        f"{size / 1024:9.0f} KiB {now['#' + k] - before['#' + k]:8d}  {k}"
        for size, k in grown[:count]
    ]
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--top"]:
        print(top(argv[1], int(argv[2]) if len(argv) > 2 else 25))
        return
    prefix, flag, module, *rest = argv
    if flag != "-m":
        raise SystemExit("usage: python -m tests.bench.memtrace OUT_PREFIX -m MODULE [ARGS]")
    written = 0

    def dump(signum: int, frame: FrameType | None) -> None:
        nonlocal written
        if not tracemalloc.is_tracing():
            tracemalloc.start(int(os.environ.get("MEMTRACE_FRAMES", "10")))
            print("memtrace started", flush=True)
            return
        written += 1
        path = f"{prefix}.{written}.snap"
        tracemalloc.take_snapshot().dump(path)
        print(f"memtrace {path}", flush=True)

    signal.signal(signal.SIGUSR1, dump)
    before: Counter[str] = Counter()

    def census(signum: int, frame: FrameType | None) -> None:
        nonlocal before
        now = types_in_use()
        if before:
            print(f"memtrace census {census_text(now, before)!r}", flush=True)
        else:
            print("memtrace census taken", flush=True)
        before = now

    signal.signal(signal.SIGUSR2, census)
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
