"""Two clusters in their own network namespaces, their switches joined by a veth pair that `tbf` shapes to
60 Mbit/s (the kernel's WAN emulation of DESIGN.md §7): the federation works across real routing, not loopback."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from switch_server.netns import WanNamespaces
from tests.switch.conftest import edit_yaml, start_switch, wait_audit

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture
def wan(procs):
    # without root this fails with NetnsError naming the fix; `make test-no-root` leaves these tests out
    w = WanNamespaces(rate_mbit=60.0)
    try:
        yield w
    finally:
        procs.reap()  # the processes inside go before their namespaces
        w.close()


def test_switches_in_shaped_namespaces_relay_exactly_once(wan, procs, federation):
    ports = {"A": 7443, "B": 7443}  # each namespace has its own port space
    addr = {c: f"{wan.address(i)}:{ports[c]}" for i, c in enumerate("AB")}
    for c, other in (("A", "B"), ("B", "A")):
        edit_yaml(Path(federation["clusters"][c]["switch_yaml"]),
                  lambda d, c=c, other=other: (d.update(listen=addr[c]),
                                               d.update(peers=[{"cluster": other, "address": addr[other]}])))
    a = start_switch(procs, Path(federation["clusters"]["A"]["switch_yaml"]), prefix=tuple(wan.argv(0, [])))
    start_switch(procs, Path(federation["clusters"]["B"]["switch_yaml"]), prefix=tuple(wan.argv(1, [])))
    assert a.wan == addr["A"]
    probe = ["-m", "switch_server.cli", "probe"]
    recv = procs.start(wan.argv(1, [sys.executable, *probe, "--config", federation["clusters"]["B"]["switch_yaml"],
                                    "--recv", "--count", "24", "--timeout", "60"]))
    send = procs.start(wan.argv(0, [sys.executable, *probe, "--config", federation["clusters"]["A"]["switch_yaml"],
                                    "--send", "--to", "B", "--count", "24", "--bytes", "262144"]))
    out, _ = send.communicate(timeout=120)
    assert send.returncode == 0, out
    out, _ = recv.communicate(timeout=120)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["received"] == 24 and result["missing"] == 0 and result["duplicates"] == 0
    assert result["out_of_order"] == 0
    # switch A accepted B's link from B's namespace address: the bytes crossed the shaped veth pair
    rec = wait_audit(a, lambda r: r["action"] == "peer_accepted" and r["detail"].get("direction") == "in")
    assert rec["detail"]["address"].startswith(wan.address(1) + ":")


def test_netns_refuses_bad_rate():
    with pytest.raises(ValueError, match="rate_mbit=0"):
        WanNamespaces(rate_mbit=0)
