"""What a user could run instead of Nebula's switches, for benchmarks/relay.py: two stunnel relays or two socat relays
(sender -> relay -> mutual TLS -> relay -> receiver, on loopback, with the federation's switch certificates), each
carrying the same length-prefixed messages as the raw TLS stream.

stunnel and socat come from the distribution (`apt-get install stunnel4 socat`); `missing()` says which are not
installed, and the benchmark skips those paths with that message.
"""
from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Framed", "PlainRelayPair", "missing", "tls_files"]

_LEN = struct.Struct("!Q")


def missing() -> dict[str, str]:
    """Relay programs not installed, with the command that installs them."""
    out = {}
    for name, binary in (("stunnel", "stunnel4"), ("socat", "socat")):
        if shutil.which(binary) is None and shutil.which(name) is None:
            out[name] = f"{name} is not installed (apt-get install {binary}); its column is skipped"
    return out


def tls_files(fed: dict, cluster: str) -> dict[str, str]:
    """Absolute ca, cert and key paths of one provisioned switch."""
    sw = Path(fed["clusters"][cluster]["switch_yaml"])
    tls = yaml.safe_load(sw.read_text())["tls"]
    return {k: str((sw.parent / tls[k]).resolve()) for k in ("ca", "cert", "key")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    """Whether a socket listens on TCP `port` (read from /proc: a test connection would go through the relay and
    reach the receiver as a connection of its own)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
            return True
    return False


def _wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see its log in {proc.args[-1]}'s folder")
        if _listening(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


class Framed:
    """Length-prefixed messages from socket `tx` to socket `rx` (one sender and one receiver thread)."""

    tx: socket.socket
    rx: socket.socket

    def send(self, data: bytes) -> None:
        self.tx.sendall(_LEN.pack(len(data)))
        self.tx.sendall(data)

    def _exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.rx.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionError("relay closed the connection")
            got += k
        return buf

    def recv(self) -> bytes:
        (n,) = _LEN.unpack(self._exact(8))
        return self._exact(n)


class PlainRelayPair(Framed):
    """sender -> relay A (plain TCP in, TLS out) -> relay B (TLS in, plain TCP out) -> receiver, on loopback.

    `kind` is "stunnel" or "socat". Both relays authenticate each other with the federation's switch certificates
    (mutual TLS, as the switches do). `pids` are the two relay processes, and with `remote` the receiving one:
    their CPU is the path's."""

    def __init__(self, kind: str, fed: dict, remote: Any = None) -> None:
        a, b = tls_files(fed, "A"), tls_files(fed, "B")
        self.remote = remote  # (a `_receiver.RemoteReceiver("tcp")`: the receiver in a process of its own)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"nebula-{kind}-"))
        if remote is not None:
            lst, recv_port = None, remote.port
        else:
            lst = socket.create_server(("127.0.0.1", 0))
            recv_port = lst.getsockname()[1]
        tls_port, in_port = _free_port(), _free_port()
        if kind == "stunnel":
            binary = shutil.which("stunnel4") or shutil.which("stunnel")
            cmds = [self._stunnel(binary, "b", False, f"127.0.0.1:{tls_port}", f"127.0.0.1:{recv_port}", b),
                    self._stunnel(binary, "a", True, f"127.0.0.1:{in_port}", f"127.0.0.1:{tls_port}", a)]
        elif kind == "socat":
            opts = lambda f: f"cert={f['cert']},key={f['key']},cafile={f['ca']},verify=1,nodelay"  # noqa: E731
            cmds = [["socat", f"OPENSSL-LISTEN:{tls_port},bind=127.0.0.1,reuseaddr,{opts(b)}",
                     f"TCP:127.0.0.1:{recv_port},nodelay"],
                    ["socat", f"TCP-LISTEN:{in_port},bind=127.0.0.1,reuseaddr,nodelay",
                     f"OPENSSL:127.0.0.1:{tls_port},{opts(a)},commonname=switch"]]
        else:
            raise ValueError(f"unknown relay {kind!r}; use stunnel or socat")
        self.procs = []
        for i, (cmd, port) in enumerate(zip(cmds, (tls_port, in_port))):
            with open(self.tmp / f"relay{i}.log", "wb") as log:
                p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
            self.procs.append(p)
            _wait_port(port, p, kind)
        self.tx = socket.create_connection(("127.0.0.1", in_port))
        self.tx.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pids = [p.pid for p in reversed(self.procs)]  # (relay A, then B)
        if lst is None:
            self.pids.append(self.remote.pid)
            return
        lst.settimeout(20)
        self.rx, _ = lst.accept()
        lst.close()
        self.rx.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _stunnel(self, binary: str, name: str, client: bool, accept: str, connect: str, f: dict) -> list[str]:
        conf = self.tmp / f"{name}.conf"
        conf.write_text("\n".join([
            "foreground = yes", f"pid = {self.tmp / (name + '.pid')}", "debug = 3",
            "socket = l:TCP_NODELAY=1", "socket = r:TCP_NODELAY=1", f"[{name}]",
            f"client = {'yes' if client else 'no'}", f"accept = {accept}", f"connect = {connect}",
            f"cert = {f['cert']}", f"key = {f['key']}", f"CAfile = {f['ca']}", "verifyChain = yes", ""]))
        return [binary, str(conf)]

    def close(self) -> None:
        self.tx.close()
        if self.remote is not None:
            self.remote.close()
        else:
            self.rx.close()
        for p in self.procs:
            p.terminate()  # (each relay is one process of its own session)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
