"""Memory a broker does not need is not loaded.

aiohttp (with its dependencies ~11 MB of a broker's RSS) serves only the metrics
endpoint; a broker without ``[metrics]`` does not import it.
"""

from __future__ import annotations

import json
import subprocess
import sys

CODE = (
    "import json, sys, mdeci.broker.app, mdeci.commands.broker; "
    "print(json.dumps(sorted(sys.modules)))"
)


def test_a_broker_without_metrics_does_not_load_aiohttp() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "mdeci.broker.app" in loaded
    assert not [name for name in loaded if name.split(".")[0] == "aiohttp"]
