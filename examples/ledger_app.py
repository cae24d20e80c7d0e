"""An application on mdeci.client that survives its own crash without losing or repeating.

It subscribes (once: a restart finds its subscription), then records each notification in
a ledger kept in its cursor file. The ledger entry and the acknowledgement are one durable
write, so after a kill -9 at any instant the next run starts right after the last entry::

    python examples/ledger_app.py --socket var/agent/api.sock --cursor var/ledger.json \\
        --subject 'stocks.*' --filter "Stock == 'PETR4'"

Each notification also prints ``got NSEQ MSG_ID TEXT``; a print is not part of the
checkpoint, so after a crash the line of an unacknowledged notification may print again
(the ledger has it once). ``--until N`` exits 0 once the ledger holds N entries.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from mdeci.client import Client, ClientError, FileCursor


async def run(args: argparse.Namespace) -> int:
    cursor = FileCursor(args.cursor)
    ledger: list[dict[str, object]] = list((cursor.state or {}).get("ledger", []))
    async with Client(args.socket) as client:
        # The stream first: a new cursor starts after the agent's newest notification, so
        # one that matches the new subscription cannot slip in between.
        stream = await client.notifications(cursor)
        async with stream:
            await client.ensure_subscription(args.subject, args.filter)
            print(f"ready ledger={len(ledger)}", flush=True)
            if args.until is not None and len(ledger) >= args.until:
                return 0
            async for note in stream:
                await asyncio.sleep(args.work)  # the application's work on it
                ledger.append({"nseq": note.nseq, "msg_id": note.msg_id, "text": note.text})
                await stream.ack(note, state={"ledger": ledger})
                print(f"got {note.nseq} {note.msg_id} {note.text}", flush=True)
                if args.until is not None and len(ledger) >= args.until:
                    return 0
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the agent's api_socket")
    parser.add_argument("--cursor", required=True, help="this application's cursor file")
    parser.add_argument("--subject", default="stocks.*")
    parser.add_argument("--filter", default="")
    parser.add_argument("--work", type=float, default=0.0, help="seconds of work per item")
    parser.add_argument("--until", type=int, help="exit once the ledger has N entries")
    args = parser.parse_args()
    try:
        return asyncio.run(run(args))
    except ClientError as exc:
        print(f"ledger_app: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
