"""Federated job files: paths resolved against the file, unknown keys and bad values named with the fix."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nebula.config.schema import ConfigError
from nebula.federated.config import load_federated_job

BASE = {"job": "j", "mode": "federated", "controller": {"cluster": "A"},
        "clusters": [{"id": "A", "worker": "prov/A/worker.yaml", "num_clients": 2}]}


def _write(tmp_path, **over):
    doc = {**BASE, **over}
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def test_a_job_loads_with_paths_resolved_and_defaults(tmp_path):
    job = load_federated_job(_write(tmp_path, strategy={"name": "fedadam", "options": {"eta": 0.1}}))
    assert job.clusters[0].worker == str(tmp_path / "prov/A/worker.yaml")
    assert job.controller.dir == str(tmp_path / "fl")
    assert job.strategy.name == "fedadam" and job.wan_once and job.validity.min_updates == 1
    assert (job.max_examples_per_client, job.max_update_norm, job.initial_model, job.initial_clients) == \
        (1_000_000, 1e6, None, 3)
    assert job.model_dtypes == ("float32",) and job.max_model_bytes == 2 * 1024**3


@pytest.mark.parametrize("over,needle", [
    ({"roundz": 3}, "unknown key roundz"),
    ({"validity": {"min_updates": 0}}, "validity.min_updates=0 must be >= 1"),
    ({"validity": {"min_fraction_examples": 1.5}}, "min_fraction_examples=1.5"),
    ({"strategy": {"name": "fedsgd"}}, "unknown strategy 'fedsgd'"),
    ({"strategy": {"name": "krum", "options": {"num_byzantine": -1}}}, "num_byzantine=-1"),
    ({"controller": {"cluster": "Z"}}, "controller.cluster 'Z' is not under clusters"),
    ({"mode": "pipeline"}, "is not federated; start it with `nebula launch`"),
    ({"deadline_s": 0}, "deadline_s=0"),
    # non-finite numbers: refused by the bounded loader, naming the key (security._yaml)
    ({"deadline_s": float("inf")}, "deadline_s (line"),
    ({"startup_timeout_s": float("nan")}, "startup_timeout_s (line"),
    ({"clusters": [{"id": "A", "worker": "w.yaml", "num_clients": 300000000}]},
     "clusters[0]: num_clients=300000000 must be between 0 and 100000"),
    ({"clients_per_round": 10**12}, "clients_per_round=1000000000000 must be between 0 and 100000"),
    ({"rounds": 10**12}, "rounds=1000000000000 must be between 1 and 10000000"),
    ({"piece_bytes": 2**40}, "piece_bytes=1099511627776 must be between 4096 and 67108864"),
    ({"max_update_norm": float("inf")}, "max_update_norm (line"),
    ({"max_examples_per_client": 0}, "max_examples_per_client=0 must be between 1"),
    ({"model_dtypes": ["int8"]}, "model_dtypes: 'int8' is not a numpy floating dtype name"),
    ({"initial_clients": 0}, "initial_clients=0 must be between 1 and 100"),
    ({"strategy": {"name": "fedprox", "options": {"mu": float("inf")}}},
     "strategy.options.mu (line"),
])
def test_bad_job_files_are_refused_with_the_key_and_the_fix(tmp_path, over, needle):
    with pytest.raises(ConfigError) as e:
        load_federated_job(_write(tmp_path, **over))
    assert needle in str(e.value) and "job.yaml" in str(e.value)
    if "(line" in needle:
        assert "is not a finite number" in str(e.value)


SA = {"protocol": "secagg+", "signers": "signers/client-{index}"}
DPS = {"clip_norm": 1.0, "noise_multiplier": 1.0}
THREE = [{"id": "A", "worker": "w.yaml", "num_clients": 3}]


def test_privacy_sections_load_with_their_defaults(tmp_path):
    job = load_federated_job(_write(tmp_path, clusters=THREE, secure_aggregation={**SA, "max_weight": 1},
                                    differential_privacy={**DPS, "mode": "distributed"},
                                    strategy={"name": "fedadagrad"}))
    sa, dp = job.secure_aggregation, job.differential_privacy
    assert (sa.clip_range, sa.max_weight, sa.max_dropout, sa.degree, sa.threshold, sa.stage_timeout_s) == \
        (1.0, 1, 0.1, 0, 0, 10.0)
    assert (dp.mode, dp.delta, dp.target_epsilon, dp.accountant) == ("distributed", 1e-5, None, "rdp")
    plain = load_federated_job(_write(tmp_path))
    assert plain.secure_aggregation is None and plain.differential_privacy is None


@pytest.mark.parametrize("over,needle", [
    ({"secure_aggregation": {**SA, "protocol": "secagg"}}, "secure_aggregation.protocol='secagg' is not known"),
    ({"secure_aggregation": {**SA, "stage_timeout_s": 0}}, "secure_aggregation.stage_timeout_s=0"),
    ({"secure_aggregation": {**SA, "clip_range": 0}}, "secure_aggregation.clip_range=0"),
    ({"secure_aggregation": SA, "strategy": {"name": "median"}}, "strategy 'median' needs every client's update"),
    ({"secure_aggregation": SA, "strategy": {"name": "krum", "options": {"num_byzantine": 0}}},
     "strategy 'krum' needs every client's update"),
    ({"secure_aggregation": SA, "strategy": {"name": "fedasync"}}, "strategy 'fedasync' applies each client's"),
    ({"secure_aggregation": SA, "update_codec": "ef(int8_block)"},
     "update_codec 'ef(int8_block)' does not compose with secure_aggregation"),
    ({"secure_aggregation": {**SA, "clip_range": 1000.0, "max_weight": 1}, "update_codec": "fp16",
      "clusters": [{"id": "A", "worker": "w.yaml", "num_clients": 100}]},
     "update_codec 'fp16' with 100 clients per combiner leaves"),
    ({"secure_aggregation": SA, "clusters": [{"id": "A", "worker": "w.yaml", "num_clients": 2}]},
     "clusters[0] (A): num_clients=2, but secure_aggregation needs at least 3 clients"),
    ({"secure_aggregation": SA, "algorithm": "owl", "task": "m:f"}, "apply to algorithm: rounds, not owl"),
    ({"differential_privacy": {**DPS, "clip_norm": -1}}, "differential_privacy.clip_norm=-1.0 must be > 0"),
    ({"differential_privacy": {**DPS, "mode": "global"}}, "differential_privacy.mode='global' is not one of"),
    ({"differential_privacy": {**DPS, "accountant": "moments"}}, "differential_privacy.accountant='moments'"),
    ({"differential_privacy": {**DPS, "delta": 1}}, "differential_privacy.delta=1.0 must be in (0, 1)"),
    ({"differential_privacy": {**DPS, "nois_multiplier": 1}}, "unknown key differential_privacy.nois_multiplier"),
    ({"differential_privacy": {"clip_norm": 1.0}}, "missing required key differential_privacy.noise_multiplier"),
    ({"differential_privacy": {**DPS, "mode": "distributed"}},
     "differential_privacy.mode=distributed splits the noise among the clients of a secure sum"),
    ({"differential_privacy": DPS, "secure_aggregation": SA},
     "differential_privacy needs a fixed weighting (one client's data size must not move the mean's "
     "denominator), but secure_aggregation.max_weight=1000; set secure_aggregation.max_weight: 1"),
    ({"differential_privacy": DPS, "strategy": {"name": "trimmed_mean"}},
     "differential_privacy calibrates its noise to a sum of clipped updates, which strategy 'trimmed_mean'"),
    ({"differential_privacy": DPS, "strategy": {"name": "fedbuff"}}, "which strategy 'fedbuff' does not take"),
])
def test_privacy_combinations_that_do_not_hold_are_refused_in_one_line(tmp_path, over, needle):
    over = {"clusters": THREE, **over}
    with pytest.raises(ConfigError) as e:
        load_federated_job(_write(tmp_path, **over))
    msg = str(e.value)
    assert needle in msg and "job.yaml" in msg and "\n" not in msg, msg


def test_the_privacy_settings_the_readme_shows_load_as_printed(tmp_path):
    from tests.sites.readme import blocks, section

    readme = Path(__file__).resolve().parents[2] / "recipes" / "federated" / "README.md"
    (code,) = [c for lang, c in blocks(section(readme, "## Privacy: secure aggregation")) if lang == "yaml"]
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump({**BASE, "clusters": THREE}) + code)
    job = load_federated_job(f)
    sa, dp = job.secure_aggregation, job.differential_privacy
    assert (sa.protocol, sa.clip_range, sa.max_weight, sa.max_dropout, sa.stage_timeout_s) == ("secagg+", 0.05, 1, 0.1,
                                                                                             10.0)
    assert (dp.clip_norm, dp.noise_multiplier, dp.mode, dp.delta, dp.accountant, dp.target_epsilon) == \
        (0.5, 1.1, "distributed", 1e-5, "rdp", 8.0)
    assert job.strategy.name == "fedadagrad" and job.strategy.options == {"eta": 0.1, "beta_1": 0.9, "tau": 0.001}
