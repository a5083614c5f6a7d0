"""The WAN fault harness (testbed/faults.py): the delay proxy holds each direction for its delay, keeps the
stream whole and in order; over namespaces with delay, jitter, loss, a link cut and a switch restart on a schedule,
the switches still deliver every probe message exactly once and in order."""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest

from testbed.faults import DelayProxy, FaultyWan, Schedule, free_port, periodic


def test_the_delay_proxy_delays_each_direction_and_keeps_the_stream_whole_and_in_order():
    async def main() -> tuple[float, bytes]:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
            w.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        proxy = DelayProxy(("127.0.0.1", free_port()), ("127.0.0.1", port), delay_ms=40, jitter_ms=10, seed=1)
        front = await asyncio.start_server(proxy._serve_one, *proxy.listen)
        r, w = await asyncio.open_connection(*proxy.listen)
        t0 = time.monotonic()
        w.write(b"ping")
        await w.drain()
        assert await r.readexactly(4) == b"ping"
        rtt = time.monotonic() - t0
        blob = os.urandom(3 * 1024 * 1024)  # several chunks each way, each with its own jitter
        w.write(blob)
        await w.drain()
        back = await r.readexactly(len(blob))
        w.close()
        front.close()
        server.close()
        return rtt, back == blob

    rtt, same = asyncio.run(main())
    assert rtt >= 2 * 0.030  # at least the delay minus the jitter, each way
    assert same


def test_delay_proxy_refuses_jitter_larger_than_its_delay():
    with pytest.raises(ValueError, match="jitter_ms=20"):
        DelayProxy(("127.0.0.1", 1), ("127.0.0.1", 2), delay_ms=10, jitter_ms=20)


def test_periodic_times():
    assert periodic(120, 500) == [120, 240, 360, 480]
    assert periodic(120, 250, first_s=30) == [30, 150]


@pytest.mark.root
@pytest.mark.slow
def test_switches_deliver_exactly_once_through_delay_jitter_loss_a_cut_and_a_switch_restart(procs, tmp_path):
    wan = FaultyWan(tmp_path / "fed", ["A", "B"], procs, delay_ms=40, jitter_ms=10, loss_per_mille=5, rate_mbit=8)
    try:
        probe = [sys.executable, "-m", "switch_server.cli", "probe"]
        n = 300
        recv = procs.start(wan.sites.argv("B", [*probe, "--config", str(wan.fed.switch_yaml("B")), "--recv",
                                                "--count", str(n), "--timeout", "120"]))
        faults = Schedule().at(2, "cut A", lambda: wan.cut("A", 4)).at(9, "restart B's switch",
                                                                          lambda: wan.restart_switch("B"))
        faults.start()
        send = procs.start(wan.sites.argv("A", [*probe, "--config", str(wan.fed.switch_yaml("A")), "--send", "--to",
                                                "B", "--count", str(n), "--bytes", "65536"]))
        out, _ = send.communicate(timeout=300)
        assert send.returncode == 0, out
        out, _ = recv.communicate(timeout=300)
        done = time.monotonic() - faults.t0
        faults.stop()
        assert [e["name"] for e in faults.log if e["error"] is None] == ["cut A", "restart B's switch"], faults.log
        assert faults.log[-1]["end"] < done  # (8 Mbit/s: the faults came while the messages were on their way)
        result = json.loads(out.strip().splitlines()[-1])
        assert (result["received"], result["missing"], result["duplicates"], result["out_of_order"]) == (n, 0, 0, 0)
    finally:
        procs.reap()
        wan.close()
