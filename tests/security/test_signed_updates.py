"""Peers updates and kits are signed by the federation's CA key: a forged, altered, foreign-signed, replayed or
rolled-back update is refused with nothing written, a hostile archive gets one line, and a kit whose files were
altered is refused when its switch checks it."""
from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from security.ca import CertificateAuthority
from security.kit_seal import APPLIED_UPDATE, KitError, check_kit, seal_kit
from security.provision import add_cluster, provision, remove_cluster
from security.signing import Statement, crl_number, key_fingerprint, sha256_hex, sign_statement
from security.updates import UpdateError, apply_update
from testbed.updates import bomb_nested, members, pack, signed


def _fed(tmp_path: Path, clusters=("A", "B", "C")) -> tuple[Path, Path]:
    """A federation on loopback and cluster A's kit unpacked at its own site: (admin dir, A's switch.yaml)."""
    out = tmp_path / "fed"
    provision("acme", list(clusters), out)
    site = tmp_path / "siteA"
    site.mkdir()
    subprocess.run(["tar", "xzf", str(out / "kits" / "A.tar.gz"), "-C", str(site)], check=True)
    return out, site / "A" / "switch.yaml"


def _kit_files(cfg: Path) -> dict[str, bytes]:
    d = cfg.parent
    return {n: (d / n).read_bytes() for n in ("switch.yaml", "crl.pem", "kit.yaml")}


def _refused(cfg: Path, update: Path, says: str, reason: str) -> str:
    before = _kit_files(cfg), (cfg.parent / APPLIED_UPDATE).exists()
    with pytest.raises(UpdateError) as err:
        apply_update(cfg, update)
    msg = str(err.value)
    assert says in msg and "\n" not in msg and err.value.reason == reason, msg
    assert (_kit_files(cfg), (cfg.parent / APPLIED_UPDATE).exists()) == before  # nothing written
    assert [p.name for p in cfg.parent.iterdir() if p.name.startswith(".")] == []  # nothing staged is left
    return msg


def _number(path: Path) -> int:
    return crl_number(x509.load_pem_x509_crl(path.read_bytes()))


def test_a_forged_update_readding_a_removed_cluster_with_an_old_crl_is_refused(tmp_path):
    out, cfg = _fed(tmp_path)
    old_crl = (cfg.parent / "crl.pem").read_bytes()  # the CRL of any old kit: it revokes nobody
    peers = yaml.safe_load(cfg.read_text())["peers"]
    removed = remove_cluster(out, "C")
    real = Path(removed["updates"]["A"])
    forged_doc = {"federation": "acme", "cluster": "A", "revision": 99, "peers": peers}  # C listed again
    forged = yaml.safe_dump(forged_doc, sort_keys=False).encode()
    # the attack as it was: no signature at all
    _refused(cfg, pack(tmp_path / "r99.tar.gz", {"update.yaml": forged, "crl.pem": old_crl}), "is not signed",
             "unsigned")
    # the admin's real signature kept beside forged files: they are not what it signed
    sig = members(real)["update.sig"]
    _refused(cfg, pack(tmp_path / "r99s.tar.gz", {"update.yaml": forged, "crl.pem": old_crl, "update.sig": sig}),
             "its update.yaml was altered after the admin signed it", "altered")
    _refused(cfg, pack(tmp_path / "crl.tar.gz", {**members(real), "crl.pem": old_crl}),
             "its crl.pem was altered after the admin signed it", "altered")
    # the admin's real next update still applies: C is gone and its certificates revoked
    said = apply_update(cfg, real)
    ca = CertificateAuthority.open(out / "ca")
    assert said.startswith(f"revision 2: peers B 127.0.0.1:") and "revokes 2 certificate(s)" in said
    assert key_fingerprint(ca.cert.public_key())[:23] in said
    assert [p["cluster"] for p in yaml.safe_load(cfg.read_text())["peers"]] == ["B"]
    assert _number(cfg.parent / "crl.pem") > crl_number(x509.load_pem_x509_crl(old_crl))
    state = check_kit(cfg, federation="acme", cluster="A", ca_path=cfg.parent / "ca.pem",
                      crl_path=cfg.parent / "crl.pem", peers=["B"])
    assert (state.revision, state.peers, state.source) == (2, ("B",), "applied-update.json (revision 2)")


def test_a_repointed_or_widened_peer_is_refused(tmp_path):
    out, cfg = _fed(tmp_path)
    real = Path(add_cluster(out, "D")["updates"]["A"])
    files = members(real)
    doc = yaml.safe_load(files["update.yaml"])
    doc["peers"][0]["address"] = "203.0.113.9:7443"  # B re-pointed
    _refused(cfg, pack(tmp_path / "moved.tar.gz", {**files, "update.yaml": yaml.safe_dump(doc).encode()}),
             "its update.yaml was altered", "altered")
    doc = yaml.safe_load(files["update.yaml"])
    doc["peers"][0]["accounts"] = ["nebula", "other"]  # B's routes widened
    _refused(cfg, pack(tmp_path / "wide.tar.gz", {**files, "update.yaml": yaml.safe_dump(doc).encode()}),
             "its update.yaml was altered", "altered")
    doc = yaml.safe_load(files["update.yaml"])
    doc["peers"] = doc["peers"][:1]  # C and D dropped
    _refused(cfg, pack(tmp_path / "drop.tar.gz", {**files, "update.yaml": yaml.safe_dump(doc).encode()}),
             "its update.yaml was altered", "altered")
    assert "revision 2" in apply_update(cfg, real)


def test_an_update_signed_by_another_key_is_refused(tmp_path):
    out, cfg = _fed(tmp_path)
    real = Path(add_cluster(out, "D")["updates"]["A"])
    files = members(real)
    doc = yaml.safe_load(files["update.yaml"])
    other = CertificateAuthority.init(tmp_path / "other-ca", "acme")  # the same federation's name, another key
    foreign = signed(other, tmp_path / "other.tar.gz", {**doc, "revision": 50}, (other.dir / "crl.pem").read_bytes())
    msg = _refused(cfg, foreign, "is signed by another key", "bad_signature")
    assert key_fingerprint(other.cert.public_key()) in msg and "not by this kit's CA" in msg
    # another key's signature under the CA's fingerprint
    sig = json.loads(members(foreign)["update.sig"])
    sig["signer"] = key_fingerprint(CertificateAuthority.open(out / "ca").cert.public_key())
    _refused(cfg, pack(tmp_path / "claimed.tar.gz", {**members(foreign), "update.sig": json.dumps(sig).encode()}),
             "its signature does not verify", "bad_signature")
    # B's own update, signed and all, is not A's
    _refused(cfg, Path(add_cluster(out, "E")["updates"]["B"]), "is for cluster B of federation acme", "other_site")


def test_a_replayed_or_rolled_back_update_is_refused(tmp_path):
    out, cfg = _fed(tmp_path)
    kit_crl = (cfg.parent / "crl.pem").read_bytes()
    r2 = Path(add_cluster(out, "D")["updates"]["A"])
    r3 = Path(remove_cluster(out, "C")["updates"]["A"])
    assert "revision 2" in apply_update(cfg, r2)
    assert "revision 3" in apply_update(cfg, r3)
    _refused(cfg, r2, "is revision 2, this kit is at revision 3 already", "old_revision")
    _refused(cfg, r3, "is revision 3, this kit is at revision 3 already", "old_revision")
    # even the admin's own key does not roll the CRL back: a newer revision with an older CRL is refused
    ca = CertificateAuthority.open(out / "ca")
    doc = {**yaml.safe_load(members(r3)["update.yaml"]), "revision": 4}
    msg = _refused(cfg, signed(ca, tmp_path / "r4.tar.gz", doc, kit_crl), "older than number", "old_crl")
    assert f"carries CRL number {crl_number(x509.load_pem_x509_crl(kit_crl))}" in msg


_ALIASES = b"""federation: acme
cluster: A
revision: 9
a: &a [x, x, x, x, x, x, x, x, x]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
peers: [*c, *c, *c, *c, *c, *c, *c, *c, *c]
"""


@pytest.mark.parametrize("make, says", [
    (lambda t, m: pack(t / "u.tar.gz", {"../update.yaml": m["update.yaml"], **m}), "holds '../update.yaml'"),
    (lambda t, m: pack(t / "u.tar.gz", {**m, "update.sig": m["update.sig"], "update.yaml ": b""}),
     "holds 'update.yaml '"),
    (lambda t, m: _link_archive(t / "u.tar.gz", m, tarfile.SYMTYPE), "(a link)"),
    (lambda t, m: _link_archive(t / "u.tar.gz", m, tarfile.LNKTYPE), "(a link)"),
    (lambda t, m: _dup_archive(t / "u.tar.gz", m), "(a second copy)"),
    (lambda t, m: pack(t / "u.tar.gz", {"update.yaml": m["update.yaml"], "update.sig": m["update.sig"]}),
     "lacks crl.pem"),
    (lambda t, m: pack(t / "u.tar.gz", {}), "lacks update.yaml and crl.pem and update.sig"),
    (lambda t, m: pack(t / "u.tar.gz", {"update.yaml": bomb_nested(3000), "crl.pem": m["crl.pem"]}),
     "is not signed"),
    (lambda t, m: pack(t / "u.tar.gz", {**m, "update.sig": b"[" * 100000 + b"]" * 100000}),
     "update.sig is not a signed statement"),
    (lambda t, m: pack(t / "u.tar.gz", {**m, "update.sig": b"{}"}), "update.sig is malformed"),
    (lambda t, m: _huge(t / "u.tar.gz"), "larger than a peers update can be"),
    (lambda t, m: pack(t / "u.tar.gz", {**m, "crl.pem": b"x" * (2 << 20)}), "is larger than 1048576 bytes"),
    (lambda t, m: _plain(t / "u.tar.gz", b"not an archive at all"), "is not a peers update archive"),
    (lambda t, m: _plain(t / "u.tar.gz", b"\x1f\x8b\x08\x00" + b"\xff" * 64), "is not a peers update archive"),
    (lambda t, m: t / "missing.tar.gz", "is not a peers update archive"),
])
def test_a_hostile_update_archive_is_one_line(tmp_path, make, says):
    out, cfg = _fed(tmp_path, ("A", "B"))
    real = Path(add_cluster(out, "C")["updates"]["A"])
    reason = "unsigned" if says == "is not signed" else "bad_signature" if "update.sig is" in says else "malformed"
    _refused(cfg, make(tmp_path, members(real)), says, reason)
    assert "revision 2" in apply_update(cfg, real)  # (and the real one still applies)


def _link_archive(dest: Path, files: dict[str, bytes], kind: bytes) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        info = tarfile.TarInfo("crl.pem")
        info.type, info.linkname = kind, "/etc/passwd"
        tar.addfile(info)
    return dest


def _dup_archive(dest: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        for name, data in [*files.items(), ("update.yaml", files["update.yaml"])]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dest


def _huge(dest: Path) -> Path:
    dest.write_bytes(b"\0" * (1 << 20) + b"x")
    return dest


def _plain(dest: Path, data: bytes) -> Path:
    dest.write_bytes(data)
    return dest


@pytest.mark.parametrize("text, says", [(bomb_nested(3000), "nests too deeply"),
                                        (_ALIASES, "aliases are not accepted here"),
                                        (b"\xff\xfe not utf-8", "cannot be read")])
def test_a_signed_yaml_bomb_is_still_one_line(tmp_path, text, says):
    """Even a file the admin's key signed is parsed within bounds (the signature is checked first)."""
    out, cfg = _fed(tmp_path, ("A", "B"))
    ca = CertificateAuthority.open(out / "ca")
    st = Statement("peers_update", "acme", "A", 9, _number(ca.crl_path), ("B",),
                   (("update.yaml", sha256_hex(text)), ("crl.pem", sha256_hex(ca.crl_path.read_bytes()))))
    bomb = pack(tmp_path / "bomb.tar.gz", {"update.yaml": text, "crl.pem": ca.crl_path.read_bytes(),
                                            "update.sig": sign_statement(st, ca.cert, ca.key)})
    _refused(cfg, bomb, says, "malformed")


def test_a_kit_is_checked_against_its_signed_manifest(tmp_path):
    out, cfg = _fed(tmp_path)
    d = cfg.parent

    def check(peers=("B", "C")):
        return check_kit(cfg, federation="acme", cluster="A", ca_path=d / "ca.pem", crl_path=d / "crl.pem",
                         peers=list(peers))

    state = check()
    ca = CertificateAuthority.open(out / "ca")
    assert (state.revision, state.peers, state.signer) == (1, ("B", "C"), key_fingerprint(ca.cert.public_key()))
    assert set(json.loads((d / "kit.sig").read_text())["statement"]["files"]) >= {
        "ca.pem", "switch.pem", "switch.key", "README.md", "start", "worker.yaml", "workers/worker.pem"}
    with pytest.raises(KitError, match="lists peer Z, which the admin's signed peers .* do not include"):
        check(("B", "Z"))
    check(("B",))  # fewer peers than signed: the site's own choice
    crl = (d / "crl.pem").read_bytes()
    pem = (d / "workers" / "worker.pem").read_bytes()
    (d / "workers" / "worker.pem").write_bytes(pem.replace(b"A", b"B", 1))
    with pytest.raises(KitError, match=r"kit file .*workers/worker.pem was altered since the admin signed the kit"):
        check()
    (d / "workers" / "worker.pem").write_bytes(pem)
    (d / "README.md").unlink()
    with pytest.raises(KitError, match=r"kit file .*README.md is missing"):
        check()
    subprocess.run(["tar", "xzf", str(out / "kits" / "A.tar.gz"), "-C", str(d.parent), "A/README.md"], check=True)
    check()
    # a CRL of this CA older than the signed one is refused; so is a manifest the kit's CA did not sign
    seal = json.loads((d / "kit.sig").read_text())
    ca.write_crl(d / "crl.pem")
    seal_kit(ca, d, "acme", "A", 1, ["B", "C"])  # (sealed with the newer CRL)
    assert _number(d / "crl.pem") > crl_number(x509.load_pem_x509_crl(crl))
    (d / "crl.pem").write_bytes(crl)
    with pytest.raises(KitError, match="crl.pem is number .*, older than number .* that the admin signed"):
        check()
    seal["statement"]["revision"] = 7
    (d / "kit.sig").write_text(json.dumps(seal))
    with pytest.raises(KitError, match="kit.sig: its signature does not verify"):
        check()


def test_nebula_admin_crls_carry_a_rising_crl_number(tmp_path):
    from security.cli import main as admin

    ca = CertificateAuthority.init(tmp_path / "ca", "acme")
    numbers = [_number(ca.crl_path)]
    for i in range(2):
        assert admin(["crl", "--ca", str(ca.dir), "--out", str(tmp_path / f"crl{i}.pem")]) == 0
        numbers.append(_number(tmp_path / f"crl{i}.pem"))
    leaf = ca.issue("w", "worker", "A", out_dir=tmp_path / "w")
    ca.revoke(leaf.serial, "key_compromise")
    numbers.append(_number(ca.crl_path))
    assert numbers == sorted(set(numbers)) and numbers[0] >= 1


def test_a_switch_refuses_its_crl_put_back_to_an_older_one(tmp_path):
    """The CRL file is re-read whenever it changes: an older CRL of the same CA (one that revokes fewer) is refused,
    and the switch keeps the newer one."""
    from nebula.config import load_switch_config
    from switch_server.metrics import SwitchMetrics
    from switch_server.peers import PeerTrust, SwitchError

    out, cfg_path = _fed(tmp_path, ("A", "B"))
    cfg = load_switch_config(cfg_path)
    trust = PeerTrust(SwitchMetrics(), lambda *a, **k: None, "switch:A", lambda *a, **k: None)
    trust.load(cfg)
    crl = cfg_path.parent / "crl.pem"
    old, old_number = crl.read_bytes(), _number(crl)
    CertificateAuthority.open(out / "ca").write_crl(crl)
    trust.load(cfg)
    newer = trust.crl_number[1]
    assert newer > old_number
    crl.write_bytes(old)
    with pytest.raises(SwitchError, match=f"is number {old_number}, older than number {newer} in use"):
        trust.load(cfg)
    assert trust.crl_number[1] == newer


def test_an_update_that_inflates_past_its_bound_is_refused_before_tar_reads_a_header(tmp_path):
    """A pax header is read whole by tarfile: a small archive of a huge one is refused by its inflated size."""
    import gzip

    from security.updates import MAX_INFLATED_BYTES, UpdateError, _members

    bomb = tmp_path / "A-r9.tar.gz"
    with gzip.open(bomb, "wb") as gz:
        gz.write(b"\0" * (MAX_INFLATED_BYTES + 512))
    assert bomb.stat().st_size < 64 * 1024
    with pytest.raises(UpdateError, match="inflates to more than"):
        _members(bomb)
