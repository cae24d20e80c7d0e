"""``mdeci analytics``: the Spark jobs of :mod:`analytics.cli` (which, being a lower layer,
does not know :class:`~mdeci.commands.Command`).

The jobs need the ``analytics`` extra (pyspark, pyarrow, pandas), which a plain
``pip install mdeci`` does not bring: without it a step says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from mdeci.commands import Command

EXTRA = frozenset({"pyspark", "pyarrow", "pandas", "py4j"})
# What each step runs on: checked before the step reads its input, so that a host
# without the extra hears of it first, whatever the input.
NEEDS = {"churn": ("pyspark", "pyarrow"), "watch": ("pyspark", "pyarrow"), "report": ("pyarrow",)}


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The optional package ``exc`` is about, or None for any other missing module."""
    top = (exc.name or "").split(".")[0]
    return top if top in EXTRA else None


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from analytics.cli import add_arguments

    add_arguments(parser)


def _not_installed(step: str, package: str) -> int:
    print(
        f"mdeci analytics {step}: error: {package} is not installed; "
        "install the extra: pip install 'mdeci[analytics]'",
        file=sys.stderr,
    )
    return 2


def _run(args: argparse.Namespace) -> int:
    step = args.analytics_command
    for package in NEEDS.get(step, ()):
        if importlib.util.find_spec(package) is None:
            return _not_installed(step, package)
    from analytics.cli import run

    try:
        return run(args)
    except ModuleNotFoundError as exc:
        missing = _missing_extra(exc)
        if missing is None:
            raise
        return _not_installed(step, missing)


COMMANDS = {"analytics": Command("analytics", _add_arguments, _run)}
