"""docs/agent.md "The protocol from other languages" run as written against a real agent:
the shell lines (``socat``) subscribe and publish, and the Node.js snippet tails from a
cursor and prints the notification."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from tests.agent.farend import GUARD
from tests.client.conftest import Deployment
from tests.peers import require_binary

ROOT = Path(__file__).resolve().parents[2]
DOC_SOCKET = "var/agent/api.sock"


def snippets() -> tuple[str, str]:
    """The section's ``sh`` and ``js`` code blocks."""
    text = (ROOT / "docs" / "agent.md").read_text()
    section = text.split("### The protocol from other languages", 1)[1].split("\n## ", 1)[0]
    blocks = dict(re.findall(r"```(sh|js)\n(.*?)```", section, flags=re.S))
    return blocks["sh"], blocks["js"]


async def run(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), GUARD)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_the_socat_and_node_examples_subscribe_publish_and_tail(
    deployment: Deployment, tmp_path: Path
) -> None:
    require_binary("socat", "apt-get install socat")
    require_binary("node", "apt-get install nodejs")
    sh, js = snippets()
    sock = str(deployment.socket)
    assert sh.startswith(f"sock={DOC_SOCKET}\n") and f'"{DOC_SOCKET}"' in js
    # The shell lines up to the tail, which runs until ^C: Node's tail stands for it.
    requests = sh.split("# resume after", 1)[0].replace(f"sock={DOC_SOCKET}", f"sock={sock}")
    answers = [json.loads(line) for line in (await run("bash", "-c", requests)).splitlines()]
    assert [a["ok"] for a in answers] == [True, True], answers
    assert (answers[1]["state"], answers[1]["matched"]) == ("published", 1), answers

    script = tmp_path / "tail.js"
    script.write_text(js.replace(f'"{DOC_SOCKET}"', json.dumps(sock)))
    node = await asyncio.create_subprocess_exec(
        "node", str(script), "0", stdout=asyncio.subprocess.PIPE
    )
    try:
        assert node.stdout is not None
        line = await asyncio.wait_for(node.stdout.readline(), GUARD)
        assert line.decode() == "1 stocks.petr4 buy\n"
    finally:
        node.kill()
        await node.wait()
