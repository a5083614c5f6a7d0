"""Signed peers updates as an attacker makes them: archives packed from chosen members, updates signed by a chosen
CA key, YAML nested past any reader's bound; and the switch's view of its links while one is applied."""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
from pathlib import Path

import yaml
from cryptography import x509

from security.ca import CertificateAuthority
from security.signing import Statement, crl_number, sha256_hex, sign_statement
from testbed.procs import BIN

__all__ = ["bomb_nested", "link_up", "members", "pack", "signed", "switch_cli", "unpack"]


def members(path: Path) -> dict[str, bytes]:
    """The members of tar archive `path` by name."""
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def pack(dest: Path, files: dict[str, bytes]) -> Path:
    """A gzipped tar archive at `dest` of `files` (name: bytes), whatever they hold."""
    with tarfile.open(dest, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def signed(ca: CertificateAuthority, dest: Path, doc: dict, crl: bytes) -> Path:
    """An update of `doc` and `crl` signed by `ca`'s key (the admin's, or another CA's to forge one)."""
    text = yaml.safe_dump(doc, sort_keys=False).encode()
    st = Statement("peers_update", doc["federation"], doc["cluster"], doc["revision"],
                   crl_number(x509.load_pem_x509_crl(crl)), tuple(p["cluster"] for p in doc["peers"]),
                   (("update.yaml", sha256_hex(text)), ("crl.pem", sha256_hex(crl))))
    return pack(dest, {"update.yaml": text, "crl.pem": crl, "update.sig": sign_statement(st, ca.cert, ca.key)})


def bomb_nested(depth: int) -> bytes:
    """An update.yaml whose peers list nests `depth` deep."""
    return b"federation: acme\ncluster: A\nrevision: 9\npeers: " + b"[" * depth + b"]" * depth + b"\n"


def switch_cli(*args: str) -> subprocess.CompletedProcess:
    """`nebula-switch ARGS...` run to its end (a minute at most)."""
    return subprocess.run([str(BIN / "nebula-switch"), *args], capture_output=True, text=True, timeout=60)


def unpack(archive: Path, site: Path) -> Path:
    """Kit `archive` unpacked into the new directory `site`."""
    site.mkdir()
    subprocess.run(["tar", "xzf", str(archive), "-C", str(site)], check=True)
    return site


def link_up(cfg: Path, peer: str, up: bool, timeout_s: float = 30.0) -> None:
    """Wait until `nebula-switch status` of the switch of `cfg` shows its link to `peer` up (or down)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = switch_cli("status", "--config", str(cfg), "--json")
        if st.returncode == 0 and json.loads(st.stdout)["links"].get(peer, {}).get("up", False) == up:
            return
        time.sleep(0.2)
    raise AssertionError(f"link to {peer} not {'up' if up else 'down'}: {st.stdout[-2000:]} {st.stderr[-2000:]}")
