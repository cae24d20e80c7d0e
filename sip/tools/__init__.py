"""Command-line tools to poke the stack: ``python -m sip registrar|uas`` (see README)."""
