"""``python -m sip registrar`` (filled in with the registrar core)."""

from __future__ import annotations

import argparse


async def serve(args: argparse.Namespace) -> int:
    raise NotImplementedError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass
