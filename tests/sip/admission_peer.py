"""A SIP endpoint for the admission tests, in a process of its own so that its RSS and
descriptors can be read from /proc: :class:`Transports` on 127.0.0.1 (UDP, TCP and TLS)
with the stream limits given as JSON, answering every request 200.

Run: ``python -m tests.sip.admission_peer CERT KEY LIMITS_JSON``. It prints one JSON
line with its ports; then each line read on stdin gets one JSON line with the admission
counts back; end of stdin stops it.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import sys

from sip.aio.transport import Address, StreamLimits, Transports
from sip.message import Request, make_response, serialize


def stats(transports: Transports) -> dict[str, object]:
    gate = transports.gate
    policy = gate.policy
    return {
        "total": policy.total,
        "pending": policy.pending,
        "sources": policy.sources(),
        "refused": gate.refused,
        "evicted": gate.evicted,
        "expired": {phase.value: n for phase, n in gate.expired.items()},
        "handshake_failures": gate.handshake_failures,
        "peak_total": gate.peak_total,
        "peak_pending": gate.peak_pending,
        "peak_source": gate.peak_source,
        "scheduled": policy.scheduled,
    }


async def serve(cert: str, key: str, limits: StreamLimits) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    holder: list[Transports] = []

    def on_parsed(msg: object, source: Address, kind: str) -> None:
        if isinstance(msg, Request) and msg.method != "ACK":
            reply = serialize(make_response(msg, 200, to_tag="peer"))
            holder[0].send_soon(reply, source, kind)

    transports = Transports(lambda data, source, kind: None, on_parsed, limits=limits,
                            tls_server=context)  # fmt: skip
    holder.append(transports)
    local = await transports.open("127.0.0.1", 0)
    assert transports.tls_local is not None
    print(json.dumps({"tcp": local[1], "tls": transports.tls_local[1]}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while await loop.run_in_executor(None, sys.stdin.readline):
            print(json.dumps(stats(transports)), flush=True)
    finally:
        await transports.close()


def main() -> None:
    cert, key, limits = sys.argv[1:4]
    asyncio.run(serve(cert, key, StreamLimits(**json.loads(limits))))


if __name__ == "__main__":
    main()
