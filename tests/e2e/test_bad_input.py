"""Bad input gets an ``error`` frame or a one-line CLI error, stores nothing, and the
broker keeps serving.

Over RUDP, straight to the broker, on the peer of a real session: bad filters, unknown
ops, bytes that are not CBOR, an oversized publish, out-of-range TTLs. Through the CLI
(``python -m mdeci sub`` against a running agent): one line on stderr, exit 2, no
traceback. And a Hypothesis property on the broker core: random bytes as frames give
only ``error`` frames and leave the store as it was.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import cbor2
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mdeci.agent.daemon import run_agent
from mdeci.broker import Broker, BrokerCoreConfig, MemorySink
from mdeci.errors import FrameError
from mdeci.frames import (
    FRAME_TYPES,
    MAX_FRAME_BYTES,
    Error,
    List,
    Pub,
    PubOk,
    Sub,
    SubOk,
    Subs,
    decode,
)
from tests.agent.farend import agent_config, lo_only
from tests.agent.test_real_broker import start_broker
from tests.broker.conftest import T0, FakeClock, WaitingSink
from tests.e2e.harness_b import ROOT, START_GUARD, Device, devices, snapshot, sqlite_store, uri

ALICE = uri("alice")

BAD_FRAMES: list[tuple[str, bytes, int, str]] = [
    # (what, bytes, code, words in the message)
    ("bad filter", cbor2.dumps({"op": "sub", "req": 11, "subject": "a.*", "filter": "(x =="}),
     400, "filter: position"),
    ("filter with eval", cbor2.dumps(
        {"op": "sub", "req": 12, "subject": "a.*", "filter": "__import__('os')"}), 400, "filter"),
    ("bad subject", cbor2.dumps({"op": "sub", "req": 13, "subject": "a..b"}), 400, "subject"),
    ("unknown op", cbor2.dumps({"op": "frobnicate", "req": 14}), 400, "unknown op"),
    ("op the broker sends", cbor2.dumps({"op": "subs", "req": 15, "items": []}), 400, "op"),
    ("not CBOR", b"\xff\xfe not cbor at all", 400, "CBOR"),
    ("CBOR, not a map", cbor2.dumps([1, 2, 3]), 400, "map"),
    ("trailing bytes", cbor2.dumps({"op": "list", "req": 16}) + b"\x00", 400, "after"),
    ("ttl 0", cbor2.dumps({"op": "sub", "req": 17, "subject": "a.*", "ttl": 0}), 400, "ttl"),
    ("ttl < 0", cbor2.dumps({"op": "sub", "req": 18, "subject": "a.*", "ttl": -5}), 400, "ttl"),
    ("ttl 2**63", cbor2.dumps({"op": "sub", "req": 19, "subject": "a.*", "ttl": 2**63}), 400,
     "ttl"),
    ("ttl 2**64 (a bignum tag)", cbor2.dumps({"op": "sub", "req": 23, "subject": "a.*",
                                              "ttl": 2**64}), 400, "tags"),
    ("ttl text", cbor2.dumps({"op": "sub", "req": 20, "subject": "a.*", "ttl": "1h"}), 400,
     "ttl"),
    ("ttl float", cbor2.dumps({"op": "sub", "req": 21, "subject": "a.*", "ttl": 1.5}), 400,
     "ttl"),
    ("oversized publish", cbor2.dumps(
        {"op": "pub", "req": 22, "msg_id": "big", "subject": "a.b",
         "payload": b"x" * (MAX_FRAME_BYTES - 200)}), 413, "too large"),
]  # fmt: skip


async def test_bad_frames_over_rudp_get_errors_and_store_nothing(tmp_path: Path) -> None:
    store, clock, sink = sqlite_store(tmp_path / "db"), FakeClock(), WaitingSink()
    broker = await start_broker(tmp_path, store, clock, sink)
    try:
        async with devices() as opened:
            alice = await Device.open("alice", "127.0.0.2")
            opened.append(alice)
            await alice.call(broker)
            await asyncio.wait_for(sink.wait_for("media_connected", ALICE), 30)
            before = snapshot(store.engine)
            for what, data, code, words in BAD_FRAMES:
                answer = await alice.ask(data)
                assert isinstance(answer, Error), (what, answer)
                assert answer.code == code, (what, answer)
                assert words.lower() in answer.message.lower(), (what, answer)
                # Still serving: a valid request right after is answered.
                listed = await alice.ask(List(req=1000))
                assert isinstance(listed, Subs) and listed.items == (), what
                assert snapshot(store.engine) == before, what
            # The request id is named when it could be read.
            answer = await alice.ask(BAD_FRAMES[0][1])
            assert isinstance(answer, Error) and answer.req == 11

            # A TTL over the maximum is not an error: it is clamped (sub-ok says to what).
            ok = await alice.ask(Sub(req=30, subject="a.*", ttl=10**12))
            assert isinstance(ok, SubOk)
            assert ok.expires_at == T0 + broker.config.subscriptions.max_ttl
            published = await alice.ask(Pub(req=31, msg_id="m", subject="a.b"))
            assert isinstance(published, PubOk) and published.matched == 1
    finally:
        await broker.close()
        store.engine.dispose()


async def _cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mdeci", *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), START_GUARD)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    store, clock, sink = sqlite_store(tmp_path / "db"), FakeClock(), WaitingSink()
    broker = await start_broker(tmp_path, store, clock, sink)
    cfg = agent_config(tmp_path / "a", "alice", "127.0.0.2", broker.sip_addr[1])
    agent = await run_agent(cfg, address_source=lo_only)
    try:
        await asyncio.wait_for(agent.wait_connected(), 30)
        before = snapshot(store.engine)
        sock = str(cfg.api_socket)
        cases = [
            (("sub", "a.*", "--filter", "(Price <"), "filter: position"),
            (("sub", "a.*", "--filter", "Stock == PETR4"), "filter"),
            (("sub", "a..b"), "subject"),
            (("sub", "a.*", "--ttl", "0"), "ttl"),
            (("sub", "a.*", "--ttl", "-3"), "ttl"),
        ]
        for args, words in cases:
            code, out, err = await _cli(*args, "--socket", sock)
            assert code == 2, (args, code, out, err)
            assert err.count("\n") == 1 and err.startswith("mdeci sub: error: "), (args, err)
            assert words in err and "Traceback" not in err, (args, err)
            assert out == ""
            assert snapshot(store.engine) == before, args
        code, out, err = await _cli("sub", "a.*", "--filter", "Price < 25", "--socket", sock)
        assert (code, err) == (0, ""), err
        assert out.startswith("subscribed ")
    finally:
        await agent.close()
        await broker.close()
        store.engine.dispose()


# ---------------------------------------------------------------------------- property


def _cbor_maps() -> st.SearchStrategy[bytes]:
    """CBOR maps that look like frames: real and unknown ops with random fields."""
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
        | st.binary(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                      max_size=3),
        max_leaves=8,
    )  # fmt: skip
    ops = st.sampled_from([*FRAME_TYPES, "", "SUB", "frob"]) | st.text(max_size=8)
    keys = st.sampled_from(["req", "subject", "filter", "ttl", "sub_id", "msg_id", "attrs",
                            "payload", "upto", "urgent", "items", "code", "message"])  # fmt: skip
    return st.builds(
        lambda op, rest: cbor2.dumps({"op": op, **rest}),
        ops,
        st.dictionaries(keys, values, max_size=5),
    )


def test_random_bytes_give_only_errors_and_change_nothing(tmp_path: Path) -> None:
    store, clock = sqlite_store(tmp_path / "db"), FakeClock()
    try:
        broker = Broker(store, BrokerCoreConfig(), clock, MemorySink())
        # Something to lose: a subscription and a queued notification.
        broker.handle_frame(ALICE, cbor2.dumps({"op": "sub", "req": 1, "subject": "a.*"}))
        assert broker.handle(ALICE, Pub(req=2, msg_id="m", subject="a.b"))[0].op == "pub-ok"
        before = snapshot(store.engine)

        @settings(
            max_examples=300,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(data=st.binary(max_size=200) | _cbor_maps())
        def feed(data: bytes) -> None:
            try:
                decode(data)
            except FrameError:
                pass
            else:
                assume(False)  # a well-formed request may change the store: not this test's
            replies = broker.handle_frame(ALICE, data)
            assert replies and all(isinstance(r, Error) for r in replies), replies
            assert snapshot(store.engine) == before

        feed()
        # Still serving.
        listed = broker.handle(ALICE, List(req=3))
        assert isinstance(listed[0], Subs) and len(listed[0].items) == 1
    finally:
        store.engine.dispose()
