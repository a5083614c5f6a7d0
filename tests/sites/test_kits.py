"""Provisioning from a federation file: portable per-site kits (relative paths, the site's own secrets only, start
script, README, archive), one-line errors for a bad file, clusters added and removed with peers updates, and
updates applied only where they belong."""
from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from nebula.config import load_switch_config, load_worker_config
from security.ca import CertificateAuthority
from security.cli import main as admin
from security.federation import FederationError, load_federation
from security.signing import key_fingerprint
from security.updates import UpdateError, apply_update
from security.provision import add_cluster, provision_spec, remove_cluster

SPEC = """\
federation: acme
ca: {cert_days: 90, crl_days: 3}
link: {shape: {rate_mbit: 60, delay_ms: 5}}
clusters:
  - name: A
    host: 10.70.0.1
    port: 7443
    accounts: [{name: research, workers: [worker, trainer]}]
  - {name: B, host: b.example.org, port: 8443, local: tcp://0.0.0.0:8500, local_tls: 0.0.0.0:8501,
     link: {chunk_bytes: 262144}}
"""


def _archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def _provision(tmp_path: Path) -> tuple[Path, dict]:
    spec = tmp_path / "federation.yaml"
    spec.write_text(SPEC)
    return tmp_path / "fed", provision_spec(load_federation(spec), tmp_path / "fed")


def test_kits_are_portable_and_hold_only_their_sites_secrets(tmp_path):
    out, summary = _provision(tmp_path)
    kits = {c: _archive(out / "kits" / f"{c}.tar.gz") for c in "AB"}
    secrets_of = {c: {n: b for n, b in files.items() if n.endswith((".key", ".key_secret"))}
                  for c, files in kits.items()}
    for c, files in kits.items():
        other = "B" if c == "A" else "A"
        assert all(n.startswith(f"{c}/") for n in files)  # one directory, named after its cluster
        assert not any(n.endswith("ca.key") for n in files)  # the CA's key stays with the admin
        blob = b"".join(files.values())
        assert not any(secret in blob for secret in secrets_of[other].values())  # no other site's secret
        assert {f"{c}/start", f"{c}/README.md", f"{c}/ca.pem", f"{c}/crl.pem", f"{c}/kit.yaml"} <= set(files)
        assert stat.S_IMODE(os.stat(out / "kits" / f"{c}.tar.gz").st_mode) == 0o600
    # shipped elsewhere and unpacked, each kit loads on its own: no path points outside it
    site = tmp_path / "siteB"
    site.mkdir()
    subprocess.run(["tar", "xzf", str(out / "kits" / "B.tar.gz"), "-C", str(site)], check=True)
    raw = yaml.safe_load((site / "B" / "switch.yaml").read_text())
    assert not [v for v in (*raw["tls"].values(), raw["audit"]["log"], raw["state_dir"]) if os.path.isabs(v)]
    cfg = load_switch_config(site / "B" / "switch.yaml")
    assert cfg.tls.ca == str(site / "B" / "ca.pem") and cfg.tls.crl == str(site / "B" / "crl.pem")
    assert cfg.listen == "0.0.0.0:8443" and cfg.local.endpoint == "tcp://0.0.0.0:8500"
    # B offers its workers on other hosts mutual TLS, with each worker's own certificate from the kit; A does not
    assert cfg.local.tls_endpoint == "0.0.0.0:8501"
    wb = load_worker_config(site / "B" / "worker.yaml")
    assert wb.tls_endpoint == "0.0.0.0:8501" and wb.tls.cert == str(site / "B" / "workers" / "worker.pem")
    assert all(Path(p).is_file() for p in (wb.tls.ca, wb.tls.cert, wb.tls.key, wb.tls.crl))
    assert load_worker_config(out / "A" / "worker.yaml").tls is None
    assert load_switch_config(out / "A" / "switch.yaml").local.tls_endpoint == ""
    assert cfg.peers[0].address == "10.70.0.1:7443"
    assert cfg.link.shape.rate_mbit == 60 and cfg.link.chunk_bytes == 262144  # the federation's, then B's own
    assert stat.S_IMODE(os.stat(site / "B" / "switch.key").st_mode) == 0o600
    assert "./start" in (site / "B" / "README.md").read_text() and os.access(site / "B" / "start", os.X_OK)
    # A's accounts: one credential per worker name, each in its account
    a = {w: load_worker_config(out / "A" / f) for w, f in (("worker", "worker.yaml"), ("trainer", "worker-trainer.yaml"))}
    assert {w.account for w in a.values()} == {"research"} and a["trainer"].name == "trainer"
    assert summary["clusters"]["A"]["listen"] == "10.70.0.1:7443"


@pytest.mark.parametrize("text, says", [
    ("federation: acme\nclusters:\n  - {name: A, host: h, port: 1, lisen: 0.0.0.0:1}\n",
     "unknown key clusters[0].lisen; did you mean 'listen'?"),
    ("federation: acme\nclusters:\n  - {name: A, host: h}\n", "missing required key clusters[0].port"),
    ("federation: acme\nclusters:\n  - {name: A, host: h, port: 1}\n  - {name: A, host: g, port: 2}\n",
     "clusters[1].name 'A' is given twice"),
    ("federation: acme\nclusters:\n  - {name: A, host: h, port: 7}\n  - {name: B, host: h, port: 7}\n",
     "clusters[1].port: h:7 is taken by cluster A"),
    ("federation: acme\nfederation: other\nclusters: []\n", "key 'federation' is given twice"),
    ("federation: acme\nclusters:\n  - {name: A, host: 10.0.0.1, port: 0}\n", "clusters[0].port 0 must be 1-65535"),
    ("federation: acme\nca: {days: yes}\nclusters: []\n", "ca.days: expected int, got bool"),
    ("federation: acme\nclusters:\n  - {name: A, host: h, port: 7, local_tls: 'h:7'}\n",
     "clusters[0].local_tls: h:7 is taken by cluster A"),
    ("federation: acme\nclusters:\n  - {name: A, host: 10.0.0.1, port: 7, local_tls: '10.0.0.1:0'}\n",
     "clusters[0].local_tls '10.0.0.1:0': port 0 (a free port picked here) is only for a switch on this machine's "
     "loopback"),
])
def test_a_bad_federation_file_is_one_line_naming_the_key(tmp_path, text, says):
    f = tmp_path / "federation.yaml"
    f.write_text(text)
    with pytest.raises(FederationError) as err:
        load_federation(f)
    msg = str(err.value)
    assert says in msg and str(f) in msg and "\n" not in msg


def test_add_and_remove_clusters_send_each_other_site_a_peers_update(tmp_path, capsys):
    out, _ = _provision(tmp_path)
    assert admin(["provision", "--federation", "acme", "--clusters", "A,B,C", "--out", str(out)]) == 1
    refusal = capsys.readouterr().err
    assert refusal.count("\n") == 1 and f"add C with `nebula-admin provision add-cluster C --out {out}" in refusal
    site_a = tmp_path / "siteA"
    site_a.mkdir()
    subprocess.run(["tar", "xzf", str(out / "kits" / "A.tar.gz"), "-C", str(site_a)], check=True)

    added = add_cluster(out, "C", "10.70.0.3", 7443)
    assert added["revision"] == 2 and set(added["updates"]) == {"A", "B"}
    assert [p.cluster for p in load_switch_config(out / "C" / "switch.yaml").peers] == ["A", "B"]
    assert load_federation(out / "federation.yaml").names() == ["A", "B", "C"]
    # an update is for its own site only, applied once, in order
    with pytest.raises(UpdateError, match="is for cluster B of federation acme, this switch .* is A of acme"):
        apply_update(site_a / "A" / "switch.yaml", Path(added["updates"]["B"]))
    said = apply_update(site_a / "A" / "switch.yaml", Path(added["updates"]["A"]))
    assert "revision 2: peers B b.example.org:8443, C 10.70.0.3:7443" in said
    assert [p.cluster for p in load_switch_config(site_a / "A" / "switch.yaml").peers] == ["B", "C"]
    with pytest.raises(UpdateError, match="revision 2, this kit is at revision 2 already"):
        apply_update(site_a / "A" / "switch.yaml", Path(added["updates"]["A"]))

    removed = remove_cluster(out, "B")
    assert removed["revision"] == 3 and set(removed["updates"]) == {"A", "C"} and removed["removed"] == ["B"]
    assert not (out / "kits" / "B.tar.gz").exists() and (out / "B" / "audit_signing.key").exists()
    ca = CertificateAuthority.open(out / "ca")
    assert {r.status for r in ca.list() if r.cluster == "B"} == {"revoked"}
    assert apply_update(site_a / "A" / "switch.yaml", Path(removed["updates"]["A"])).endswith(
        "peers C 10.70.0.3:7443; CRL number 6 revokes 2 certificate(s); signed by the CA key sha256:"
        + key_fingerprint(ca.cert.public_key())[7:23] + "...")
    assert (site_a / "A" / "crl.pem").read_bytes() == (out / "ca" / "crl.pem").read_bytes()
    # a federation file that drops a cluster is refused with the command that removes one
    spec = load_federation(out / "federation.yaml")
    with pytest.raises(FederationError, match="holds cluster C, which the federation file no longer lists; take it "
                                              "out with `nebula-admin provision remove-cluster C"):
        provision_spec(spec.with_clusters([spec.cluster("A")]), out)


def test_an_update_with_a_foreign_crl_or_stray_files_is_refused(tmp_path):
    out, _ = _provision(tmp_path)
    site = tmp_path / "siteA"
    site.mkdir()
    subprocess.run(["tar", "xzf", str(out / "kits" / "A.tar.gz"), "-C", str(site)], check=True)
    added = add_cluster(out, "C", "10.70.0.3", 7443)
    other = CertificateAuthority.init(tmp_path / "other-ca", "acme")
    forged = tmp_path / "forged.tar.gz"
    with tarfile.open(added["updates"]["A"]) as tar, tarfile.open(forged, "w:gz") as out_tar:
        for m in tar:
            data = tar.extractfile(m).read() if m.name != "crl.pem" else (other.dir / "crl.pem").read_bytes()
            m.size = len(data)
            out_tar.addfile(m, io.BytesIO(data))
    before = (site / "A" / "switch.yaml").read_bytes(), (site / "A" / "crl.pem").read_bytes()
    with pytest.raises(UpdateError, match="its crl.pem was altered after the admin signed it"):
        apply_update(site / "A" / "switch.yaml", forged)
    assert ((site / "A" / "switch.yaml").read_bytes(), (site / "A" / "crl.pem").read_bytes()) == before
    assert [p.name for p in (site / "A").iterdir() if p.name.startswith(".")] == []  # (nothing staged is left)
    with pytest.raises(UpdateError, match="holds 'A'; a peers update holds only update.yaml, crl.pem, update.sig"):
        apply_update(site / "A" / "switch.yaml", out / "kits" / "A.tar.gz")


def test_a_changed_address_in_the_file_is_a_peers_update_for_every_site(tmp_path):
    out, _ = _provision(tmp_path)
    site = tmp_path / "siteB"
    site.mkdir()
    subprocess.run(["tar", "xzf", str(out / "kits" / "B.tar.gz"), "-C", str(site)], check=True)
    same = provision_spec(load_federation(out / "federation.yaml"), out)  # nothing changed: nothing to send
    assert same["revision"] == 1 and same["updates"] == {}
    text = (out / "federation.yaml").read_text().replace("port: 8443", "port: 9443").replace(":8443", ":9443")
    (out / "federation.yaml").write_text(text)
    moved = provision_spec(load_federation(out / "federation.yaml"), out)
    assert moved["revision"] == 2 and set(moved["updates"]) == {"A", "B"}
    assert load_switch_config(out / "A" / "switch.yaml").peer("B").address == "b.example.org:9443"
    said = apply_update(site / "B" / "switch.yaml", Path(moved["updates"]["B"]))
    assert said.endswith("this switch now listens on 0.0.0.0:9443: restart it to bind there")
    assert load_switch_config(site / "B" / "switch.yaml").listen == "0.0.0.0:9443"


def test_a_cluster_launches_with_its_own_worker_file_only(tmp_path):
    """On its own host a site has its kit, not the others': the job file still names theirs, and only the launching
    cluster's file must be there."""
    from nebula.config import ConfigError
    from nebula.config.job import load_job_config
    from nebula.launch.preflight import validate_job
    from tests.pipeline.helpers import TWO_STAGES, toy_job

    out, _ = _provision(tmp_path)
    job = toy_job(tmp_path, clusters=[{"id": "A", "worker": str(out / "A" / "worker.yaml")},
                                      {"id": "B", "worker": "siteB/B/worker.yaml"}], stages=TWO_STAGES)
    assert validate_job(load_job_config(job), "A") == ["embed", "head"]
    with pytest.raises(ConfigError, match="cluster 'B': switch connection file .*siteB/B/worker.yaml does not exist"):
        validate_job(load_job_config(job), "B")
