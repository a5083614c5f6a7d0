"""Provisioning: the files load with the switch/worker schemas, CURVE keys work with ZeroMQ, TLS links work."""
from __future__ import annotations

import os
import socket
import stat
import threading

import pytest
import zmq
import zmq.auth
from cryptography import x509
from zmq.utils import z85

from nebula.config import load_switch_config, split_host_port
from nebula.config.worker import load_worker_config
from security.ca import CertificateAuthority
from security.curve import local_password, read_curve_keypair, write_curve_keypair, z85_decode, z85_encode
from security.errors import CAError, SecurityError
from security.identity import Identity, identity_of
from security.provision import provision
from security.tls import check_peer, client_context, server_context


def test_z85_matches_zeromq_and_keypair_files_load_in_pyzmq(tmp_path):
    data = os.urandom(32)
    assert z85_encode(data) == z85.encode(data).decode()
    assert z85_decode(z85_encode(data)) == data
    with pytest.raises(ValueError, match="multiple of 5"):
        z85_decode("abc")
    public = write_curve_keypair(tmp_path / "k.key_secret", tmp_path / "k.key")
    pub, sec = zmq.auth.load_certificate(tmp_path / "k.key_secret")
    assert pub.decode() == public and zmq.curve_public(sec) == pub
    assert zmq.auth.load_certificate(tmp_path / "k.key") == (pub, None)
    assert stat.S_IMODE(os.stat(tmp_path / "k.key_secret").st_mode) == 0o600
    text = (tmp_path / "k.key_secret").read_text()
    other = write_curve_keypair(tmp_path / "o.key_secret")
    (tmp_path / "mixed").write_text(text.replace(public, other))
    with pytest.raises(SecurityError, match="does not belong"):
        read_curve_keypair(tmp_path / "mixed")


def test_curve_keys_secure_a_real_zeromq_connection(tmp_path):
    server_pub = write_curve_keypair(tmp_path / "s.key_secret")
    client_pub = write_curve_keypair(tmp_path / "c.key_secret")
    _, s_sec = zmq.auth.load_certificate(tmp_path / "s.key_secret")
    _, c_sec = zmq.auth.load_certificate(tmp_path / "c.key_secret")
    ctx = zmq.Context()
    try:
        srv = ctx.socket(zmq.PAIR)
        srv.curve_server, srv.curve_secretkey, srv.curve_publickey = True, s_sec, server_pub.encode()
        port = srv.bind_to_random_port("tcp://127.0.0.1")
        cli = ctx.socket(zmq.PAIR)
        cli.curve_secretkey, cli.curve_publickey, cli.curve_serverkey = c_sec, client_pub.encode(), server_pub.encode()
        cli.connect(f"tcp://127.0.0.1:{port}")
        cli.send(b"ping")
        assert srv.poll(10000) and srv.recv() == b"ping"
    finally:
        ctx.destroy(linger=0)


def test_local_password_is_shared_by_the_pair_only(tmp_path):
    """Worker and switch derive the same IPC password from their own secret and the other's public key (X25519);
    another switch or another worker gets a different one."""
    keys = {}
    for name in ("switch", "worker", "other_switch", "other_worker"):
        public = write_curve_keypair(tmp_path / name)
        keys[name] = (public, read_curve_keypair(tmp_path / name)[1])
    (sp, ss), (wp, ws) = keys["switch"], keys["worker"]
    mine = local_password(ws, sp)
    assert mine == local_password(ss, wp) and len(mine) == 64
    assert local_password(ws, keys["other_switch"][0]) != mine
    assert local_password(keys["other_worker"][1], sp) != mine


def test_provision_writes_loadable_configs_and_working_credentials(tmp_path):
    out = tmp_path / "fed"
    summary = provision("demo", ["A", "B", "C"], out)
    assert set(summary["clusters"]) == {"A", "B", "C"}
    for f in ("ca.pem", "ca.key", "crl.pem", "index.db"):
        assert (out / "ca" / f).exists()
    cfgs = {c: load_switch_config(out / c / "switch.yaml") for c in "ABC"}
    listens = {c: cfg.listen for c, cfg in cfgs.items()}
    ports = [split_host_port(a)[1] for a in listens.values()]
    ports += [int(cfg.local.endpoint.rsplit(":", 1)[1]) for cfg in cfgs.values()]
    assert len(set(ports)) == 6 and 0 not in ports
    for c, cfg in cfgs.items():
        assert cfg.federation == "demo" and cfg.cluster == c
        assert {p.cluster: p.address for p in cfg.peers} == {o: listens[o] for o in "ABC" if o != c}
        assert cfg.tls.ca == str((out / "ca" / "ca.pem").resolve()) and cfg.state_dir.endswith(f"{c}/state")
        cert = x509.load_pem_x509_certificate(open(cfg.tls.cert, "rb").read())
        assert identity_of(cert) == Identity("demo", "switch", c, "switch")
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "localhost" in san.get_values_for_type(x509.DNSName)
        assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
        worker = load_worker_config(out / c / "worker.yaml")
        assert worker.endpoint == cfg.local.endpoint and worker.account == "nebula" and worker.cluster == c
        w_pub, w_sec = zmq.auth.load_certificate(worker.curve_key)
        assert cfg.local.workers[0].curve_public_key == w_pub.decode() and zmq.curve_public(w_sec) == w_pub
        s_pub, _ = zmq.auth.load_certificate(cfg.local.curve_secret_key)
        assert worker.switch_curve_public_key == s_pub.decode()
        for secret in (cfg.tls.key, cfg.local.curve_secret_key, cfg.audit.signing_key, worker.curve_key,
                       out / c / "workers" / "worker.key"):
            assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
        assert identity_of(x509.load_pem_x509_certificate((out / c / "workers" / "worker.pem").read_bytes())) \
            == Identity("demo", "worker", c, "worker")
    assert not [p for p in out.iterdir() if p.name.startswith(".provision")]
    # the provisioned switch credentials complete a real mutual-TLS handshake A <- B
    a, b = cfgs["A"].tls, cfgs["B"].tls
    srv = server_context(a.ca, a.cert, a.key, a.crl)
    cli = client_context(b.ca, b.cert, b.key, b.crl)
    lsock = socket.create_server(("127.0.0.1", 0))
    seen = {}

    def serve():
        conn, _ = lsock.accept()
        with srv.wrap_socket(conn, server_side=True) as tls:
            seen["peer"] = check_peer(tls, role="switch", cluster="B", federation="demo")
            tls.sendall(b"k")

    t = threading.Thread(target=serve)
    t.start()
    with socket.create_connection(lsock.getsockname(), timeout=10) as raw, cli.wrap_socket(raw) as tls:
        assert check_peer(tls, role="switch", cluster="A", federation="demo").cluster == "A"
        assert tls.recv(1) == b"k"
    t.join(10)
    lsock.close()
    assert seen["peer"] == Identity("demo", "switch", "B", "switch")


def test_provision_refuses_to_overwrite_and_reuses_an_existing_ca(tmp_path):
    out = tmp_path / "fed"
    provision("demo", ["A", "B"], out)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(SecurityError, match="already exists and holds federation demo .clusters A, B.; provision "
                                            "into a new --out directory, or add C with `nebula-admin provision "
                                            "add-cluster C --out .*fed --host HOST --port PORT`"):
        provision("demo", ["A", "B", "C"], out)
    assert sorted(p.name for p in out.iterdir()) == before
    more = provision("demo", ["C"], tmp_path / "more", ca_dir=out / "ca")
    cfg = load_switch_config(more["clusters"]["C"]["switch_yaml"])
    assert cfg.tls.ca == str((out / "ca" / "ca.pem").resolve()) and not (tmp_path / "more" / "ca").exists()
    assert len(CertificateAuthority.open(out / "ca").list()) == 6
    with pytest.raises(CAError, match="belongs to federation 'demo', not 'other'"):
        provision("other", ["D"], tmp_path / "x", ca_dir=out / "ca")
    with pytest.raises(SecurityError, match="name a cluster twice"):
        provision("demo", ["A", "A"], tmp_path / "y")
    assert not (tmp_path / "x" / "D").exists() and not (tmp_path / "y").exists()


def test_free_ports_lie_below_the_ephemeral_range_and_are_bindable():
    """Outgoing connections draw source ports from the ephemeral range; provisioned listen ports must not."""
    import socket

    from security.provision import _ephemeral_low, free_ports

    ports = free_ports("127.0.0.1", 6)
    assert len(set(ports)) == 6
    assert all(1024 < p < _ephemeral_low() for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
