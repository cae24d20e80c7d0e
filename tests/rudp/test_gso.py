"""UDP GSO (rudp.aio.gso): how datagrams are grouped, and what arrives on loopback."""

from __future__ import annotations

import socket

import pytest

from rudp.aio import gso


def test_runs_group_equal_sizes_with_a_shorter_last_and_respect_the_limits() -> None:
    sizes = [100, 100, 100, 40, 100, 200, 200, 50, 60]
    grams = [bytes(n) for n in sizes]
    assert list(gso.runs(grams)) == [(0, 4), (4, 5), (5, 8), (8, 9)]
    many = [bytes(10)] * (gso.SEGMENTS + 1)
    assert list(gso.runs(many)) == [(0, gso.SEGMENTS), (gso.SEGMENTS, gso.SEGMENTS + 1)]
    big = [bytes(30_000)] * 3  # two fit under MAX_BYTES, not three
    assert list(gso.runs(big)) == [(0, 2), (2, 3)]
    assert list(gso.runs([])) == []


@pytest.mark.skipif(not gso.AVAILABLE, reason="UDP GSO is Linux only")
def test_one_write_arrives_as_separate_datagrams_in_order() -> None:
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        grams = [bytes([i]) * 1071 for i in range(10)] + [b"last, shorter"]
        gso.send_run(tx, grams, rx.getsockname())
        assert [rx.recv(65535) for _ in grams] == grams
