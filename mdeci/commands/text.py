"""Plain aligned tables for the client and admin commands.

Not ``rich``: importing it costs more than the rest of a client command's start-up
(docs/benchmarks.md "Client start-up"), and a table of a few rows needs none of
it. Output is plain text that ``grep`` and ``awk`` read.
"""

from __future__ import annotations

from collections.abc import Sequence


def table(rows: Sequence[Sequence[str]], *, title: str | None = None) -> str:
    """``rows`` (the first is the header, if any) as left-aligned columns, two spaces apart."""
    lines = [title] if title else []
    if rows:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
    return "\n".join(lines)
