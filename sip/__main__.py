"""``python -m sip registrar|uas``: small servers to poke the stack with (see README)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from sip.tools import registrar, uas

    parser = argparse.ArgumentParser(prog="python -m sip", description=__doc__)
    sub = parser.add_subparsers(dest="tool", required=True, metavar="TOOL")
    reg = sub.add_parser("registrar", help="a registrar (RFC 3261 §10.3) with digest auth")
    registrar.add_arguments(reg)
    ua = sub.add_parser("uas", help="a UAS answering INVITEs that carry our SDP")
    uas.add_arguments(ua)
    args = parser.parse_args(argv)
    runner = registrar.serve if args.tool == "registrar" else uas.serve
    try:
        return asyncio.run(runner(args))
    except (OSError, ValueError) as exc:
        print(f"python -m sip {args.tool}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
