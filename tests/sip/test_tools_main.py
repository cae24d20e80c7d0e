"""``python -m sip`` run by a Python without the project's dependencies (the system's,
where docs/sip.md's ``.venv/bin/python -m sip`` was not copied): one line that names the
interpreter to use, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A fresh interpreter in which sdp_transform cannot be imported, as in a system Python.
WITHOUT_SDP = (
    "import runpy, sys; sys.modules['sdp_transform'] = None; "
    "sys.argv[1:] = ['bindings', '--help']; runpy.run_module('sip', run_name='__main__')"
)


def test_a_python_without_the_dependencies_gets_one_line_and_exit_2() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_SDP], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr.startswith(
        "python -m sip: error: module 'sdp_transform' is not installed for "
    ), out.stderr
    assert out.stderr.count("\n") == 1 and ".venv/bin/python" in out.stderr
