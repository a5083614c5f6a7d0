"""Hostile frames from an authenticated peer: deeply nested meta is refused as malformed, audited, and the switch
keeps serving its other sessions."""
from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from nebula.channel import Endpoint
from nebula.config import split_host_port
from nebula.wire import FrameType, WireError, encode_frame
from nebula.wire.frame import decode_head
from nebula.wire.meta import MAX_META_DEPTH
from security.provision import provision
from testbed.federation import start_switch, wait_audit
from tests.switch.conftest import worker_yaml


def test_nesting_beyond_the_limit_is_bad_meta_and_brackets_in_strings_are_not_nesting():
    over = MAX_META_DEPTH + 1
    for meta in (b"[" * 8192, b'{"a":' * 40 + b"1" + b"}" * 40, b"[" * over + b"]" * over):
        with pytest.raises(WireError) as err:
            decode_head(encode_frame(FrameType.LINK_HELLO, meta))
        assert err.value.code == "bad_meta" and f"deeper than {MAX_META_DEPTH}" in err.value.message
    levels = MAX_META_DEPTH - 2  # inside the top-level object and its 'peers' object: the limit exactly
    fine = ('{"boot":1,"chunk_bytes":1,"max_message_bytes":1,"cluster":"' + "[{" * 2000 + '","peers":{"x":'
            + "[" * levels + "]" * levels + "}}")
    _, meta = decode_head(encode_frame(FrameType.WELCOME, fine.encode()))
    assert meta["cluster"] == "[{" * 2000


def test_switch_refuses_nested_meta_from_a_peer_and_keeps_serving(procs, tmp_path):
    fed = provision("fed", ["A", "B"], tmp_path / "fed")
    a = start_switch(procs, Path(fed["clusters"]["A"]["switch_yaml"]))
    b = start_switch(procs, Path(fed["clusters"]["B"]["switch_yaml"]))
    b_dir = b.config.parent
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(Path(fed["ca"]) / "ca.pem")
    ctx.load_cert_chain(b_dir / "switch.pem", b_dir / "switch.key")  # a peer with valid credentials, gone hostile
    with Endpoint.connect(worker_yaml(fed, "A"), job="j", rank=0) as ea, \
            Endpoint.connect(worker_yaml(fed, "B"), job="j", rank=0) as eb:
        tx, rx = ea.channel("B", 0, "good"), eb.channel("A", 0, "good")
        tx.send(b"before")
        assert rx.recv(timeout_s=30) == b"before"
        with socket.create_connection(split_host_port(a.wan), timeout=10) as raw, ctx.wrap_socket(raw) as s:
            s.sendall(encode_frame(FrameType.LINK_HELLO, b"[" * 8192))
            reply = s.recv(65536)
        rec = wait_audit(a, lambda r: r["action"] == "frame_refused")
        assert rec["outcome"] == "denied" and rec["detail"]["reason"] == "bad_meta"
        assert "deeper than" in rec["detail"]["detail"] and b"bad_meta" in reply
        tx.send(b"after")
        assert rx.recv(timeout_s=30) == b"after"
    stderr = a.log.read_text()
    assert "RecursionError" not in stderr and "Traceback" not in stderr
