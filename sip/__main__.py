"""``python -m sip registrar|uas|bindings``: small tools to poke the stack with (docs/sip.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from sip.tools import bindings, registrar, uas
    except ModuleNotFoundError as exc:
        # A Python without the project's dependencies (the system's, say): one line that
        # names the interpreter to use instead of a traceback.
        print(
            f"python -m sip: error: module {exc.name!r} is not installed for {sys.executable};"
            " run the Python of the environment mdeci is installed in"
            " (.venv/bin/python after make demo)",
            file=sys.stderr,
        )
        return 2

    parser = argparse.ArgumentParser(prog="python -m sip", description=__doc__)
    sub = parser.add_subparsers(dest="tool", required=True, metavar="TOOL")
    reg = sub.add_parser("registrar", help="a registrar (RFC 3261 §10.3) with digest auth")
    registrar.add_arguments(reg)
    ua = sub.add_parser("uas", help="a UAS answering INVITEs that carry our SDP")
    uas.add_arguments(ua)
    look = sub.add_parser("bindings", help="the contacts a registrar holds for an AOR")
    bindings.add_arguments(look)
    args = parser.parse_args(argv)
    runner = {"registrar": registrar.serve, "uas": uas.serve, "bindings": bindings.serve}[args.tool]
    try:
        return asyncio.run(runner(args))
    except (OSError, ValueError) as exc:
        print(f"python -m sip {args.tool}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
