"""The namespace harness: sites on their own addresses, only the WAN between them, and the WAN's faults (rate,
loss, link down and up) as the kernel applies them; switches in shaped namespaces relay exactly once."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from testbed.federation import LocalFederation, wait_audit
from testbed.netns import Sites

pytestmark = pytest.mark.root

_RECV = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7001)); s.settimeout(2.0)
print("ready", flush=True)
n = 0
try:
    while True:
        s.recv(100); n += 1
except socket.timeout:
    print(n, flush=True)
"""
_SEND = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[2])):
    s.sendto(b"x" * 64, (sys.argv[1], 7001))
    if i % 50 == 49: time.sleep(0.002)  # (within the receiver's socket buffer)
"""


def _tcp_reaches(sites: Sites, src: str, dst: str) -> bool:
    code = ("import socket, sys\ntry:\n socket.create_connection((sys.argv[1], 9), timeout=1.5)\nexcept "
            "ConnectionRefusedError:\n sys.exit(0)\nexcept OSError:\n sys.exit(1)")
    # a closed port answers with a reset when the host is reachable, and nothing when it is not
    return subprocess.run(sites.argv(src, [sys.executable, "-c", code, sites.address(dst)])).returncode == 0


@pytest.fixture
def sites(procs):
    # without root this fails with NetnsError naming the fix; `make test-no-root` leaves these tests out
    s = Sites(["A", "B", "C"])
    try:
        yield s
    finally:
        procs.reap()  # the processes inside go before their namespaces
        s.close()
    assert not [n for n in s.namespaces.values() if n in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                                         text=True).stdout]


def test_sites_reach_each_other_only_over_the_wan_and_its_faults_apply(sites, procs):
    assert len({sites.address(c) for c in "ABC"}) == 3
    assert _tcp_reaches(sites, "A", "C") and _tcp_reaches(sites, "C", "B")
    sites.link_down("C")
    assert not _tcp_reaches(sites, "A", "C")
    sites.link_up("C")
    assert _tcp_reaches(sites, "A", "C")
    d = sites.add("D")  # a site joins while the others run
    assert _tcp_reaches(sites, "D", "A") and d not in {sites.address(c) for c in "ABC"}
    sites.remove("D")
    if shutil.which("nft") is None:
        pytest.fail("nftables is needed for the loss knob: apt-get install nftables")
    sites.set_loss("B", 200)  # 20% of what reaches B is dropped in B's kernel
    rx = procs.start(sites.argv("B", [sys.executable, "-c", _RECV]))
    assert rx.stdout.readline().strip() == "ready"
    sent = 2000
    subprocess.run(sites.argv("A", [sys.executable, "-c", _SEND, sites.address("B"), str(sent)]), check=True)
    got = int(rx.stdout.readline())
    assert 0.70 < got / sent < 0.90, got  # binomial: 80% expected, sd 0.9%
    sites.set_loss("B", 0)
    assert _tcp_reaches(sites, "A", "B")


@pytest.mark.slow
def test_switches_in_shaped_namespaces_relay_exactly_once(procs, tmp_path):
    with Sites(["A", "B"], rate_mbit=60.0) as sites:
        try:
            fed = LocalFederation(tmp_path / "fed", ["A", "B"], procs=procs, sites=sites)
            a = fed.switches["A"]
            assert a.wan.startswith(sites.address("A") + ":")
            probe = [sys.executable, "-m", "switch_server.cli", "probe"]
            recv = procs.start(sites.argv("B", [*probe, "--config", str(fed.switch_yaml("B")), "--recv", "--count",
                                                "24", "--timeout", "60"]))
            send = procs.start(sites.argv("A", [*probe, "--config", str(fed.switch_yaml("A")), "--send", "--to", "B",
                                                "--count", "24", "--bytes", "262144"]))
            out, _ = send.communicate(timeout=120)
            assert send.returncode == 0, out
            out, _ = recv.communicate(timeout=120)
            result = json.loads(out.strip().splitlines()[-1])
            assert result["received"] == 24 and result["missing"] == 0 and result["duplicates"] == 0
            assert result["out_of_order"] == 0
            # switch A accepted B's link from B's own address
            rec = wait_audit(a, lambda r: r["action"] == "peer_accepted" and r["detail"].get("direction") == "in")
            assert rec["detail"]["address"].startswith(sites.address("B") + ":")
        finally:
            procs.reap()


def test_sites_refuse_a_bad_rate():
    with pytest.raises(ValueError, match="rate_mbit=0"):
        Sites(rate_mbit=0)
