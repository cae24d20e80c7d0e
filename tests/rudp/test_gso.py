"""UDP GSO (rudp.gso): how datagrams are grouped, and what arrives on loopback."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator

import pytest

from rudp import gso


def test_runs_group_equal_sizes_with_a_shorter_last_and_respect_the_limits() -> None:
    sizes = [100, 100, 100, 40, 100, 200, 200, 50, 60]
    grams = [bytes(n) for n in sizes]
    assert list(gso.runs(grams)) == [(0, 4), (4, 5), (5, 8), (8, 9)]
    many = [bytes(10)] * (gso.SEGMENTS + 1)
    assert list(gso.runs(many)) == [(0, gso.SEGMENTS), (gso.SEGMENTS, gso.SEGMENTS + 1)]
    big = [bytes(30_000)] * 3  # two fit under MAX_BYTES, not three
    assert list(gso.runs(big)) == [(0, 2), (2, 3)]
    assert list(gso.runs([])) == []


@contextlib.contextmanager
def _pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A receiving UDP socket on loopback (reads time out after 5 s) and a sender."""
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        yield rx, tx


@pytest.mark.skipif(not gso.AVAILABLE, reason="UDP GSO is Linux only")
def test_one_write_arrives_as_separate_datagrams_in_order() -> None:
    with _pair() as (rx, tx):
        grams = [bytes([i]) * 1071 for i in range(10)] + [b"last, shorter"]
        gso.send_run(tx, grams, rx.getsockname())
        assert [rx.recv(65535) for _ in grams] == grams


def test_segments_cuts_at_the_reported_size_and_leaves_a_plain_read_alone() -> None:
    report = [(socket.SOL_UDP, gso.UDP_GRO, (3).to_bytes(4, sys.byteorder))]
    assert gso.segments(b"aaabbbcc", report) == [b"aaa", b"bbb", b"cc"]
    assert gso.segments(b"aaa", report) == [b"aaa"]
    assert gso.segments(b"aaabbb", []) == [b"aaabbb"]


@pytest.mark.skipif(not gso.AVAILABLE, reason="UDP GSO/GRO is Linux only")
def test_a_gro_socket_reads_a_run_at_once_and_gets_the_same_datagrams_back() -> None:
    with _pair() as (rx, tx):
        if not gso.enable_gro(rx):
            pytest.skip("this kernel has no UDP_GRO")
        grams = [bytes([i]) * 1071 for i in range(10)] + [b"last, shorter"]
        gso.send_run(tx, grams, rx.getsockname())
        tx.sendto(b"alone", rx.getsockname())
        got: list[bytes] = []
        reads = 0
        while len(got) < len(grams) + 1:
            data, ancdata, _, _ = rx.recvmsg(65535, gso.ANCILLARY)
            got += gso.segments(data, ancdata)
            reads += 1
        assert got == [*grams, b"alone"]
        assert reads < len(got)  # some run came whole (loopback keeps it: one read)
