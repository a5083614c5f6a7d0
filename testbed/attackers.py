"""Attackers' tools: a hostile peer switch (`RawPeer`, an ordinary TLS client with a real provisioned certificate that
speaks the wire format directly: LINK_HELLO, then whatever frames it likes), a second worker credential of another
account (`add_worker`), the refusal a worker's frame gets (`refused`) and a process's resident memory (`rss_bytes`)."""
from __future__ import annotations

import contextlib
import socket
import ssl
from pathlib import Path

import yaml

from nebula.channel import ChannelError, Endpoint
from nebula.config import split_host_port
from nebula.wire import HEADER_BYTES, ChannelKey, Frame, FrameType, Lane, decode_frame, encode_frame, relink, unpack_header
from security.curve import write_curve_keypair
from testbed.federation import edit_yaml

__all__ = ["RawPeer", "add_worker", "refused", "rss_bytes"]


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def add_worker(fed: dict, cluster: str, name: str, account: str) -> Path:
    """A second worker credential on `cluster`'s switch (of provision summary `fed`), of another account; its
    worker.yaml."""
    wy = Path(fed["clusters"][cluster]["worker_yaml"])
    public = write_curve_keypair(wy.parent / "workers" / f"{name}.key_secret")
    edit_yaml(wy.parent / "switch.yaml", lambda d: d["local"]["workers"].append(
        {"name": name, "account": account, "curve_public_key": public}))
    doc = yaml.safe_load(wy.read_text())
    doc.update(curve_key=f"workers/{name}.key_secret", account=account, name=name)
    out = wy.parent / f"worker-{name}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def refused(endpoint: Endpoint, cluster: str, timeout_s: float = 20.0) -> str:
    """Send one frame to `cluster` and return the refusal the sender gets (AssertionError if none comes)."""
    ch = endpoint.channel(cluster, 0, "x")
    ch.send(b"may I?")
    try:
        ch.recv(timeout_s=timeout_s)
    except ChannelError as exc:
        return str(exc)
    raise AssertionError(f"a frame to {cluster} was answered, not refused")


class RawPeer:
    """TLS connection to a switch's WAN listener, authenticated as the switch of the cluster whose switch.yaml
    is given (its certificate and key)."""

    def __init__(self, wan: str, switch_yaml: str | Path, timeout_s: float = 10.0, cert: Path | None = None,
                 key: Path | None = None) -> None:
        cfg = yaml.safe_load(Path(switch_yaml).read_text())
        base = Path(switch_yaml).parent
        tls = cfg["tls"]
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.load_verify_locations(str(base / tls["ca"]))
        ctx.load_cert_chain(str(cert or base / tls["cert"]), str(key or base / tls["key"]))
        self.cluster = cfg["cluster"]
        raw = socket.create_connection(split_host_port(wan), timeout=timeout_s)
        self.sock = ctx.wrap_socket(raw)
        self.link_seq = 0

    def hello(self, epoch: int = 1) -> dict:
        """LINK_HELLO as our cluster; return the LINK_WELCOME meta."""
        self.send(encode_frame(FrameType.LINK_HELLO, {"cluster": self.cluster, "epoch": epoch}))
        frame = self.read()
        assert frame.type == FrameType.LINK_WELCOME, frame
        self.link_seq = frame.meta["resume"]
        return frame.meta

    def send(self, head: bytes, payload: bytes = b"") -> None:
        self.sock.sendall(head + payload)

    def data(self, key: ChannelKey, payload: bytes, seq: int = 1, **meta: int) -> None:
        """One single-chunk DATA message on `key` (with meta fields such as `inc` and `to`), numbered as the next
        frame of this link."""
        self.link_seq += 1
        head = encode_frame(FrameType.DATA, {**key.to_meta(), **meta}, payload, lane=Lane.ACTIVATION,
                            channel_id=key.id, seq=seq)
        self.send(relink(head, self.link_seq), payload)

    def ack(self, key: ChannelKey, seq: int, consumed: int = 0, **meta: int) -> None:
        """An ACK on `key` (the channel the acknowledged sender sends on), as the next frame of this link."""
        self.link_seq += 1
        head = encode_frame(FrameType.ACK, {**key.to_meta(), "consumed": consumed, **meta}, channel_id=key.id, seq=seq)
        self.send(relink(head, self.link_seq))

    def read(self) -> Frame:
        """The next frame the switch sends us."""
        head = self._exactly(HEADER_BYTES)
        h = unpack_header(head)
        rest = self._exactly(h.meta_len + h.payload_len)
        return decode_frame(head + rest[: h.meta_len], rest[h.meta_len :])

    def read_until(self, ftype: FrameType, limit: int = 1000) -> Frame:
        """The next frame of type `ftype` (others are skipped)."""
        for _ in range(limit):
            f = self.read()
            if f.type == ftype:
                return f
        raise AssertionError(f"no {ftype.name} frame in {limit} frames")

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("switch closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


