"""nebula.config: YAML into frozen dataclasses; unknown keys and bad types rejected with their full path."""
import dataclasses

import pytest
import yaml

from nebula.config import ConfigError, SwitchConfig, WorkerConfig, from_dict, load_switch_config, local_endpoint, to_dict

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
    """auto: IPC only where the switch's TCP host is an address of this machine; tcp/ipc force one."""
    ipc = "ipc://@nebula-fed-A"
    assert local_endpoint(from_dict(WorkerConfig, {**WORKER, "ipc_endpoint": ipc})) == (ipc, "ipc")
    assert local_endpoint(from_dict(WorkerConfig, WORKER)) == ("tcp://127.0.0.1:7000", "tcp")  # no IPC endpoint
    # 192.0.2.0/24 is reserved for documentation: never an address of this machine (nothing is sent to it)
    away = {**WORKER, "endpoint": "tcp://192.0.2.7:7000", "ipc_endpoint": ipc}
    assert local_endpoint(from_dict(WorkerConfig, away)) == ("tcp://192.0.2.7:7000", "tcp")
    assert local_endpoint(from_dict(WorkerConfig, {**away, "transport": "ipc"})) == (ipc, "ipc")
    forced = {**WORKER, "ipc_endpoint": ipc, "transport": "tcp"}
    assert local_endpoint(from_dict(WorkerConfig, forced)) == ("tcp://127.0.0.1:7000", "tcp")


def test_ipc_settings_validated():
    with pytest.raises(ConfigError, match="transport 'udp' is not one of auto, tcp, ipc"):
        from_dict(WorkerConfig, {**WORKER, "transport": "udp"})
    with pytest.raises(ConfigError, match="transport: ipc needs ipc_endpoint"):
        from_dict(WorkerConfig, {**WORKER, "transport": "ipc"})
    with pytest.raises(ConfigError, match="must start with ipc://"):
        from_dict(WorkerConfig, {**WORKER, "ipc_endpoint": "/run/nebula.sock"})
    local = {**MINIMAL["local"], "ipc_endpoint": "tcp://127.0.0.1:9"}
    with pytest.raises(ConfigError, match=r"local.ipc_endpoint .* must start with ipc://"):
        from_dict(SwitchConfig, {**MINIMAL, "local": local})


def test_paths_in_every_config_file_resolve_by_one_rule(tmp_path):
    from nebula.config import load_job_config, load_worker_config
    from nebula.config._schema import resolve_path

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
