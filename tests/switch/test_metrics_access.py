"""Who reads a switch's Prometheus metrics: the endpoint listens on loopback unless the config says `public: true`,
and accounts appear in its labels only as opaque, stable ids that the switch's own state directory maps to names."""
from __future__ import annotations

import json
import stat
import urllib.request
from pathlib import Path

import pytest

from nebula.config import ConfigError, load_switch_config
from nebula.config.schema import from_dict
from nebula.config.switch import MetricsConfig
from switch_server.metrics import METRIC_ACCOUNTS_FILE, AccountIds, SwitchMetrics
from switch_server.status import status_path
from testbed.federation import edit_yaml, start_switch


def test_a_non_loopback_metrics_address_needs_public_and_says_why():
    with pytest.raises(ConfigError, match=r"metrics.listen '0.0.0.0:9100' is not a loopback address: .*no "
                                          r"authentication.*metrics.public: true"):
        from_dict(MetricsConfig, {"listen": "0.0.0.0:9100"}, "metrics")
    assert from_dict(MetricsConfig, {"listen": "0.0.0.0:9100", "public": True}, "metrics").public
    assert MetricsConfig().listen.startswith("127.0.0.1:") and not MetricsConfig().account_names


def test_account_labels_are_opaque_stable_and_mapped_for_the_admin_only(tmp_path):
    m = SwitchMetrics(AccountIds(tmp_path))
    m.route_refused.labels(account="alice", cluster="B").inc()
    text = _text(m)
    label = AccountIds(tmp_path)("alice")  # a restarted switch: the same id
    assert f'account="{label}"' in text and "alice" not in text and label.startswith("acct-")
    mapping = tmp_path / METRIC_ACCOUNTS_FILE
    assert json.loads(mapping.read_text()) == {label: "alice"}
    assert stat.S_IMODE(mapping.stat().st_mode) == 0o600
    assert AccountIds(tmp_path)("bob") != label
    named = SwitchMetrics(None)  # metrics.account_names: true
    named.route_refused.labels(account="alice", cluster="B").inc()
    assert 'account="alice"' in _text(named)


def _text(m: SwitchMetrics) -> str:
    from prometheus_client import generate_latest
    return generate_latest(m.registry).decode()


def test_a_started_switch_serves_metrics_on_loopback_only(procs, federation):
    config = Path(federation["clusters"]["A"]["switch_yaml"])
    edit_yaml(config, lambda doc: doc.pop("metrics", None))  # the default
    a = start_switch(procs, config)
    st = json.loads(status_path(load_switch_config(a.config)).read_text())
    host, port = st["metrics"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert "nebula_switch_workers" in urllib.request.urlopen(f"http://{st['metrics']}/metrics", timeout=10).read().decode()
    assert a.stop() == 0
