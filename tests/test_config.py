"""nebula.config: YAML into frozen dataclasses; unknown keys and bad types rejected with their full path."""
import dataclasses

import pytest
import yaml

from nebula.config import (ConfigError, SwitchConfig, WorkerConfig, from_dict, load_switch_config, local_endpoint,
                           stream_path, to_dict)

MINIMAL = {
    "federation": "fed",
    "cluster": "A",
    "listen": "127.0.0.1:0",
    "tls": {"ca": "ca.pem", "cert": "switch.pem", "key": "switch.key", "crl": "crl.pem"},
    "local": {"endpoint": "tcp://127.0.0.1:7000", "curve_secret_key": "switch.key_secret",
              "workers": [{"name": "w0", "account": "alice", "curve_public_key": "x" * 40}]},
    "audit": {"log": "audit.log", "signing_key": "audit.key"},
    "peers": [{"cluster": "B", "address": "127.0.0.1:7001"}],
    "link": {"shape": {"rate_mbit": 60, "delay_ms": 30}},
}


def test_round_trip_and_frozen(tmp_path):
    f = tmp_path / "switch.yaml"
    f.write_text(yaml.safe_dump(MINIMAL))
    cfg = load_switch_config(f)
    assert cfg.peer("B").address == "127.0.0.1:7001"
    assert cfg.link.shape.rate_mbit == 60.0
    assert cfg.tls.ca == str(tmp_path / "ca.pem")  # relative paths resolve against the file
    assert cfg.local.workers[0].jobs == ("*",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.cluster = "C"
    again = from_dict(SwitchConfig, to_dict(cfg))
    assert again == cfg


def test_unknown_key_named_with_full_path():
    bad = {**MINIMAL, "link": {"shape": {"rate_mbit": 60, "dealy_ms": 3}}}
    with pytest.raises(ConfigError, match=r"link\.shape\.dealy_ms"):
        from_dict(SwitchConfig, bad)


def test_wrong_type_and_missing_key():
    with pytest.raises(ConfigError, match=r"peers\[0\]\.address"):
        from_dict(SwitchConfig, {**MINIMAL, "peers": [{"cluster": "B", "address": 7001}]})
    with pytest.raises(ConfigError, match="missing required key tls"):
        from_dict(SwitchConfig, {k: v for k, v in MINIMAL.items() if k != "tls"})


def test_validation_quotes_value_and_fix():
    with pytest.raises(ConfigError, match="host:port"):
        from_dict(SwitchConfig, {**MINIMAL, "peers": [{"cluster": "B", "address": "nohost"}]})
    with pytest.raises(ConfigError, match="own cluster"):
        from_dict(SwitchConfig, {**MINIMAL, "peers": [{"cluster": "A", "address": "h:1"}]})
    with pytest.raises(ConfigError, match="rate_mbit"):
        from_dict(SwitchConfig, {**MINIMAL, "link": {"shape": {"rate_mbit": -1}}})


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_switch_config(tmp_path / "missing.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("cluster: [unclosed")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_switch_config(f)


WORKER = {"federation": "fed", "cluster": "A", "endpoint": "tcp://127.0.0.1:7000", "switch_curve_public_key": "x" * 40,
          "curve_key": "w.key_secret", "account": "alice"}


def test_worker_transport_chosen_by_host():
    """auto: the Unix stream socket beside the IPC endpoint only where the switch's TCP host is an address of this
    machine; tcp/unix/ipc force one."""
    ipc = "ipc://@nebula-fed-A"
    assert local_endpoint(from_dict(WorkerConfig, {**WORKER, "ipc_endpoint": ipc})) == ("@nebula-fed-A.stream", "unix")
    assert stream_path("ipc:///run/nebula/A.ipc") == "/run/nebula/A.ipc.stream"
    assert local_endpoint(from_dict(WorkerConfig, WORKER)) == ("tcp://127.0.0.1:7000", "tcp")  # no IPC endpoint
    # 192.0.2.0/24 is reserved for documentation: never an address of this machine (nothing is sent to it)
    away = {**WORKER, "endpoint": "tcp://192.0.2.7:7000", "ipc_endpoint": ipc}
    assert local_endpoint(from_dict(WorkerConfig, away)) == ("tcp://192.0.2.7:7000", "tcp")
    assert local_endpoint(from_dict(WorkerConfig, {**away, "transport": "ipc"})) == (ipc, "ipc")
    assert local_endpoint(from_dict(WorkerConfig, {**away, "transport": "unix"})) == ("@nebula-fed-A.stream", "unix")
    forced = {**WORKER, "ipc_endpoint": ipc, "transport": "tcp"}
    assert local_endpoint(from_dict(WorkerConfig, forced)) == ("tcp://127.0.0.1:7000", "tcp")
    # a TLS endpoint serves workers away from the switch's host (`auto`), and `tls` forces it even on that host
    tls = {"tls_endpoint": "192.0.2.7:7002", "tls": {"ca": "ca.pem", "cert": "w.pem", "key": "w.key", "crl": "crl.pem"}}
    assert local_endpoint(from_dict(WorkerConfig, {**away, **tls})) == ("192.0.2.7:7002", "tls")
    assert local_endpoint(from_dict(WorkerConfig, {**WORKER, "ipc_endpoint": ipc, **tls})) == (
        "@nebula-fed-A.stream", "unix")
    assert local_endpoint(from_dict(WorkerConfig, {**WORKER, "ipc_endpoint": ipc, **tls, "transport": "tls"})) == (
        "192.0.2.7:7002", "tls")


def test_ipc_settings_validated():
    with pytest.raises(ConfigError, match="transport 'udp' is not one of auto, tcp, tls, ipc, unix"):
        from_dict(WorkerConfig, {**WORKER, "transport": "udp"})
    with pytest.raises(ConfigError, match=r"transport: tls needs tls_endpoint \(the switch's local.tls_endpoint"):
        from_dict(WorkerConfig, {**WORKER, "transport": "tls", "tls": {"ca": "a", "cert": "b", "key": "c", "crl": "d"}})
    with pytest.raises(ConfigError, match=r"tls_endpoint needs tls: \{ca, cert, key, crl\}"):
        from_dict(WorkerConfig, {**WORKER, "tls_endpoint": "127.0.0.1:7002"})
    with pytest.raises(ConfigError, match=r"tls_endpoint '7002' is not host:port"):
        from_dict(WorkerConfig, {**WORKER, "tls_endpoint": "7002", "tls": {"ca": "a", "cert": "b", "key": "c",
                                                                          "crl": "d"}})
    with pytest.raises(ConfigError, match=r"local.tls_endpoint 'nowhere' is not host:port"):
        from_dict(SwitchConfig, {**MINIMAL, "local": {**MINIMAL["local"], "tls_endpoint": "nowhere"}})
    for transport in ("ipc", "unix"):
        with pytest.raises(ConfigError, match=f"transport: {transport} needs ipc_endpoint"):
            from_dict(WorkerConfig, {**WORKER, "transport": transport})
    with pytest.raises(ConfigError, match="must start with ipc://"):
        from_dict(WorkerConfig, {**WORKER, "ipc_endpoint": "/run/nebula.sock"})
    local = {**MINIMAL["local"], "ipc_endpoint": "tcp://127.0.0.1:9"}
    with pytest.raises(ConfigError, match=r"local.ipc_endpoint .* must start with ipc://"):
        from_dict(SwitchConfig, {**MINIMAL, "local": local})


def test_paths_in_every_config_file_resolve_by_one_rule(tmp_path):
    from nebula.config import load_job_config, load_worker_config
    from nebula.config.schema import resolve_path

    sub = tmp_path / "conf"
    sub.mkdir()
    assert resolve_path("a/../k.pem", sub) == str(tmp_path / "conf" / "k.pem")
    assert resolve_path("/abs/k.pem", sub) == "/abs/k.pem" and resolve_path(None, sub) is None
    (sub / "switch.yaml").write_text(yaml.safe_dump({**MINIMAL, "state_dir": "../state"}))
    sw = load_switch_config(sub / "switch.yaml")
    assert sw.tls.key == str(sub / "switch.key") and sw.state_dir == str(tmp_path / "state")
    (sub / "worker.yaml").write_text(yaml.safe_dump({
        "federation": "fed", "cluster": "A", "endpoint": "tcp://127.0.0.1:7000", "switch_curve_public_key": "x" * 40,
        "curve_key": "keys/w.key_secret", "account": "alice"}))
    assert load_worker_config(sub / "worker.yaml").curve_key == str(sub / "keys" / "w.key_secret")
    (sub / "job.yaml").write_text(yaml.safe_dump({
        "job": "j", "recipe": {"factory": "recipes.toy:ToyRecipe"}, "train": {"steps": 1, "global_batch": 1},
        "clusters": [{"id": "A", "worker": "worker.yaml"}], "stages": [{"name": "s", "cluster": "A"}],
        "checkpoint": {"dir": "/abs/ckpt", "init_from": "../ck/step_1"}}))
    job = load_job_config(sub / "job.yaml")
    assert job.cluster("A").worker == str(sub / "worker.yaml") and job.checkpoint.dir == "/abs/ckpt"
    assert job.checkpoint.init_from == str(tmp_path / "ck" / "step_1") and job.metrics.dir == str(sub / "metrics")


def _read(tmp_path, text: str):
    from nebula.config import read_yaml

    f = tmp_path / "c.yaml"
    f.write_text(text)
    return read_yaml(f)


def test_aliases_are_refused_even_small_ones(tmp_path):
    """One rule for every YAML file (security._yaml): no file Nebula writes or documents uses an alias."""
    with pytest.raises(ConfigError, match=r"c.yaml: A \(line 2\): alias \*b: aliases are not accepted here"):
        _read(tmp_path, "base: &b {rate_mbit: 60, delay_ms: 30}\nA: *b\n")
    with pytest.raises(ConfigError, match=r"c.yaml: B.<< \(line 2\): alias \*b: aliases are not accepted"):
        _read(tmp_path, "base: &b {rate_mbit: 60}\nB: {<<: *b, delay_ms: 5}\n")


@pytest.mark.parametrize("text,needle", [
    ("a: &r {b: [1, *r]}\n", r"c.yaml: a.b\[1\] \(line 1\): alias \*r: aliases are not accepted here"),
    ("peers: {B: 1, C: 2, B: 3}\n", r"c.yaml: peers.B \(line 1\): key 'B' is given twice in one mapping"),
    ("peers: {[B]: 1}\n", r"c.yaml: peers \(line 1\): a key is a list or a mapping; keys are plain names"),
    ("a: " + "[" * 70 + "]" * 70 + "\n", r"c.yaml: a(\[0\])+ \(line 1\): nests too deeply \(more than 64 levels\)"),
    ("link:\n  delay_ms: 1.0e+999\n", r"c.yaml: link.delay_ms \(line 2\): '1.0e\+999' is not a finite number"),
    ("x: [1, .nan]\n", r"x\[1\] \(line 1\): '.nan' is not a finite number"),
    ("port: 0x" + "f" * 17 + "\n", r"port \(line 1\): integer '0xf+' \(19 digits\) is out of range"),
    ("a: [1,\n  2\n", r"c.yaml: not valid YAML at line 3, column 1 \(in a\): .*fix the syntax there"),
    ("a: 1\n# \x07 bell\n", r"c.yaml: <top> \(line 2\): cannot be read: binary or non-UTF-8 bytes"),
])
def test_refusals_are_one_line_with_file_and_key_path(tmp_path, text, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        _read(tmp_path, text)
    assert "\n" not in str(e.value)


def test_file_size_is_bounded(tmp_path):
    from security._yaml import MAX_YAML_BYTES, read_yaml

    with pytest.raises(ConfigError, match=r"c.yaml is larger than 1048576 bytes, the limit for a YAML file"):
        _read(tmp_path, "a: 1\n" + "#" * MAX_YAML_BYTES)
    assert _read(tmp_path, "a: 1\n#" + "x" * (MAX_YAML_BYTES - 8) + "\n") == {"a": 1}
    with pytest.raises(ConfigError, match=r"missing.yaml does not exist; check the path"):
        read_yaml(tmp_path / "missing.yaml")


def test_quoted_values_are_cut_short():
    """A value built in memory (or expanded from aliases) is quoted by its start, never whole."""
    shared = ["x" * 1000] * 1000
    with pytest.raises(ConfigError) as e:
        from_dict(SwitchConfig, {**MINIMAL, "cluster": [shared] * 1000})
    assert str(e.value).startswith("cluster: expected a string, got [[") and len(str(e.value)) < 200


def test_unknown_key_names_the_closest_allowed_one():
    with pytest.raises(ConfigError, match=r"unknown key link.shape.rate_mbits \(did you mean link.shape.rate_mbit\?\)"):
        from_dict(SwitchConfig, {**MINIMAL, "link": {"shape": {"rate_mbits": 60}}})
    many = {f"k{i}": 1 for i in range(50)}
    with pytest.raises(ConfigError, match=r"unknown key k0, k1, k10, k11, k12 and 45 more; allowed keys here"):
        from_dict(SwitchConfig, {**MINIMAL, **many})


def test_the_loader_class_refuses_as_read_yaml_does_under_yaml_load():
    """security.audit_evidence reads with `yaml.load(text, Loader=NoAliases)`: the same limits, as YAMLErrors."""
    from security._yaml import NoAliases, parse_yaml

    assert yaml.load("a: [1, 2]\n", Loader=NoAliases) == {"a": [1, 2]}  # noqa: S506 - the bounded loader
    for text, says in (("a: &x [1]\nb: *x\n", "aliases are not accepted here"), ("a: 1\na: 2\n", "given twice"),
                       ("a: .inf\n", "not a finite number"), ("a: " + "[" * 65 + "]" * 65 + "\n", "nests too deeply")):
        with pytest.raises(yaml.YAMLError, match=says):
            yaml.load(text, Loader=NoAliases)  # noqa: S506 - the bounded loader
        with pytest.raises(ConfigError, match=f"update.yaml in u.tar.gz: .*{says}"):
            parse_yaml(text.encode(), "update.yaml in u.tar.gz")
