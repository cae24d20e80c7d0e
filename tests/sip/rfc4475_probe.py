"""Send each RFC 4475 message of a directory to a SIP server on 127.0.0.1 and print what
it answered, one JSON object per message (``python -m tests.sip.rfc4475_probe CORPUS
PORT [NAME ...]``: the named messages, else all).

Run inside a network namespace of the test's own (``tests/sip/test_rfc4475.py``): the
messages' Vias name hosts of example.com and 192.0.2.0/24, and the server answers to
their ports on 127.0.0.1 (``received``, §18.2.1); in the namespace nothing else is
reachable. Each message goes out from a socket bound to its top Via's port, so the
answer comes back to it; a TCP listener on each such port takes the answers to Vias
naming TCP. After each message an OPTIONS of the probe's own follows: answers arrive in
order on loopback, so a UDP answer not in before the OPTIONS' was not sent, and the
OPTIONS' answer shows the server still serves.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import socket
import sys
from pathlib import Path

from sip.errors import SipParseError
from sip.message import Request, Response, parse_message

HOST = "127.0.0.1"
SIP_PORT = 5060
WAIT = 10.0  # seconds an answer may take: the server runs on the same machine


def top_via(data: bytes) -> tuple[str, int]:
    """(transport, port) of the message's top Via; UDP and 5060 when it cannot be read."""
    try:
        msg = parse_message(data)
        via = msg.top_via
    except SipParseError:
        return "UDP", SIP_PORT
    return via.transport.upper(), via.port or SIP_PORT


def sentinel(call_id: str, port: int) -> bytes:
    lines = [
        f"OPTIONS sip:probe@{HOST} SIP/2.0",
        f"Via: SIP/2.0/UDP {HOST}:{port};branch=z9hG4bK-{call_id};rport",
        "Max-Forwards: 70",
        f"From: <sip:probe@{HOST}>;tag=probe",
        f"To: <sip:probe@{HOST}>",
        f"Call-ID: {call_id}",
        "CSeq: 1 OPTIONS",
        "Content-Length: 0",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_answer(data: bytes) -> tuple[int, str | None] | None:
    """(status, Call-ID) of a response, or None (a 400 may copy the request's bad fields:
    read what we can)."""
    try:
        msg: object = parse_message(data)
    except SipParseError as exc:
        msg = exc.message
    if not isinstance(msg, Response):
        return None
    try:
        call_id: str | None = msg.call_id
    except SipParseError:
        call_id = None
    return msg.status, call_id


def raw_call_id(data: bytes) -> str | None:
    """The Call-ID a message carries, read without parsing the rest."""
    found = CALL_ID.search(data)
    return found.group(1).decode("utf-8", "surrogateescape").strip() if found else None


CALL_ID = re.compile(rb"^(?:call-id|i)[ \t]*:[ \t]*([^\r\n]*)\r\n", re.IGNORECASE | re.MULTILINE)


class Probe:
    """The probe's sockets: one UDP socket and one TCP listener per Via port; every answer
    they get goes to one queue, with the port it came to."""

    def __init__(self, server: tuple[str, int]) -> None:
        self.server = server
        self.udp: dict[int, socket.socket] = {}
        self.answers: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.listeners: list[asyncio.Server] = []

    async def open(self, ports: set[int]) -> None:
        loop = asyncio.get_running_loop()
        for port in sorted(ports | {SIP_PORT}):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((HOST, port))
            sock.setblocking(False)
            self.udp[port] = sock
            loop.add_reader(sock, self._readable, port, sock)
            self.listeners.append(
                await asyncio.start_server(functools.partial(self._stream, port), HOST, port)
            )

    def _readable(self, port: int, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(70000)
            except BlockingIOError:
                return
            self.answers.put_nowait((port, data))

    async def _stream(
        self, port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                self.answers.put_nowait((port, head))  # answers to the corpus have no body
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    async def case(self, name: str, data: bytes) -> dict[str, object]:
        """Send one message, then the OPTIONS, from the socket of its Via's port. Its
        answers are those with its Call-ID (or, with none readable, those to that socket
        before the OPTIONS'). A request our parser reads is answered by the server's
        handler, which may come after the OPTIONS' answer: it is waited for."""
        transport, port = top_via(data)
        call_id, probe_id = raw_call_id(data), f"probe-{name}"
        self.udp[port].sendto(data, self.server)
        self.udp[port].sendto(sentinel(probe_id, port), self.server)
        awaited = _readable_request(data)
        statuses: list[int] = []
        serving = False
        try:
            while not serving or (awaited and not statuses):
                got_port, raw = await asyncio.wait_for(self.answers.get(), WAIT)
                answer = read_answer(raw)
                if answer is None or answer[0] < 200:
                    continue
                status, answer_id = answer
                if answer_id == probe_id:
                    serving = True
                elif answer_id == call_id or (
                    answer_id is None and got_port == port and not serving
                ):
                    statuses.append(status)
        except TimeoutError:
            pass
        return {"case": name, "statuses": statuses, "serving": serving, "via": transport}

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        for sock in self.udp.values():
            loop.remove_reader(sock)
            sock.close()
        for listener in self.listeners:
            listener.close()


def _readable_request(data: bytes) -> bool:
    """A request our parser reads: the server's handler answers it."""
    try:
        return isinstance(parse_message(data), Request)
    except SipParseError:
        return False


async def run(corpus: Path, port: int, names: list[str]) -> None:
    files = [corpus / f"{name}.dat" for name in names] or sorted(corpus.glob("*.dat"))
    probe = Probe((HOST, port))
    await probe.open({top_via(f.read_bytes())[1] for f in files})
    try:
        for path in files:
            print(json.dumps(await probe.case(path.stem, path.read_bytes())), flush=True)
    finally:
        probe.close()


if __name__ == "__main__":
    asyncio.run(run(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
