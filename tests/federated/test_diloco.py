"""Cross-cluster data parallelism, pure parts: the outer step against its update equation, and the job file."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from nebula.config.schema import ConfigError
from nebula.config.job import load_job_config
from nebula.dataparallel import average_step, outer_step, pseudo_gradient


def _reference_sgd_nesterov(theta, grads, lr, mu, nesterov):
    """torch.optim.SGD(momentum=mu, nesterov=...) written element by element, as the DiLoCo paper runs it."""
    theta = [float(t) for t in theta]
    buf = None
    for g in grads:
        g = [float(x) for x in g]
        buf = list(g) if buf is None else [mu * b + x for b, x in zip(buf, g)]
        step = [x + mu * b for x, b in zip(g, buf)] if nesterov else buf
        theta = [t - lr * s for t, s in zip(theta, step)]
    return np.array(theta)


@pytest.mark.parametrize("nesterov", [True, False])
def test_outer_step_matches_sgd_with_nesterov_momentum(nesterov):
    rng = np.random.default_rng(0)
    theta0 = rng.standard_normal(7)
    grads = [rng.standard_normal(7) for _ in range(5)]
    anchor, buf = {"w": theta0.copy()}, None
    for g in grads:
        anchor, buf = outer_step(anchor, {"w": g}, buf, lr=0.7, momentum=0.9, nesterov=nesterov)
    np.testing.assert_allclose(anchor["w"], _reference_sgd_nesterov(theta0, grads, 0.7, 0.9, nesterov), rtol=1e-12)


def test_first_outer_step_by_hand():
    # buf = D = 2; Nesterov update = D + 0.9 * buf = 3.8; anchor = 1 - 0.7 * 3.8
    anchor, buf = outer_step({"w": np.array([1.0])}, {"w": np.array([2.0])}, None, lr=0.7, momentum=0.9)
    assert anchor["w"][0] == pytest.approx(1 - 0.7 * 3.8) and buf["w"][0] == pytest.approx(2.0)


def test_average_step_of_mean_pseudo_gradient_is_mean_of_replicas():
    rng = np.random.default_rng(1)
    anchor = {"a": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    replicas = [{k: v + rng.standard_normal(v.shape).astype(np.float32) for k, v in anchor.items()} for _ in range(3)]
    deltas = [pseudo_gradient(anchor, r) for r in replicas]
    mean_delta = {k: np.mean([d[k] for d in deltas], axis=0) for k in anchor}
    got = average_step(anchor, mean_delta)
    for k in anchor:
        assert got[k].dtype == np.float32
        np.testing.assert_allclose(got[k], np.mean([r[k] for r in replicas], axis=0), rtol=1e-5, atol=1e-6)


def test_pseudo_gradient_names_the_tensor_that_differs():
    with pytest.raises(ValueError, match=r"'b'.*\(2,\).*\(3,\)"):
        pseudo_gradient({"b": np.zeros(3)}, {"b": np.zeros(2)})
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        pseudo_gradient({"b": np.zeros(3)}, {"c": np.zeros(3)})


def _job(tmp_path, **dp):
    doc = {"job": "dp", "mode": "data_parallel", "recipe": {"factory": "recipes.toy:ToyRecipe"},
           "clusters": [{"id": "A"}, {"id": "B", "procs_per_node": 2}],
           "train": {"steps": 4, "global_batch": 8}, **dp}
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_job_file_loads_data_parallel_settings(tmp_path):
    cfg = load_job_config(_job(tmp_path, data_parallel={"sync_every": 25, "outer": {
        "algorithm": "diloco", "lr": 0.7, "momentum": 0.9, "codec": "ef(int8)"}}))
    assert cfg.mode == "data_parallel" and cfg.stages == ()
    assert cfg.data_parallel.sync_every == 25 and cfg.data_parallel.outer.codec == "ef(int8)"
    alone = cfg.intra("B")  # nebula launch --intra: the cluster trains its replica alone
    assert [c.id for c in alone.clusters] == ["B"] and alone.mode == "data_parallel"


@pytest.mark.parametrize("dp, extra, message", [
    ({"sync_every": 0}, {}, r"data_parallel.sync_every=0 must be an integer >= 1"),
    ({"sync_every": -3}, {}, r"sync_every=-3 must be an integer >= 1"),
    ({"outer": {"algorithm": "adam"}}, {}, r"data_parallel.outer.algorithm: 'adam' is not one of 'average', 'diloco'"),
    ({"outer": {"lr": 0.7, "beta": 1}}, {}, r"unknown key data_parallel.outer.beta"),
    ({"every": 3}, {}, r"unknown key data_parallel.every"),
    ({"outer": {"codec": "zip9"}}, {}, r"data_parallel.outer.codec='zip9' is not a valid codec spec"),
    ({"outer": {"momentum": 1.0}}, {}, r"momentum=1.0 in \[0, 1\)"),
    ({}, {"stages": [{"name": "embed", "cluster": "A"}]}, r"runs every stage in every cluster; remove stages"),
    ({}, {"train": {"steps": 4, "global_batch": 9}}, r"global_batch=9 .* cluster B's 2 ranks"),
])
def test_bad_data_parallel_settings_are_refused_with_their_path(tmp_path, dp, extra, message):
    with pytest.raises(ConfigError, match=message):
        load_job_config(_job(tmp_path, data_parallel=dp, **extra))


def test_outer_state_round_trips_through_a_checkpoint(tmp_path):
    from nebula.dataparallel import OuterState, pack_state, unpack_state
    from nebula.pipeline import checkpoint as ckpt

    rng = np.random.default_rng(2)
    model = {"model.fc.weight": rng.standard_normal((3, 4)).astype(np.float32),
             "model.fc.bias": rng.standard_normal(4).astype(np.float32)}
    anchor, buf = outer_step(model, {k: 0.1 * v for k, v in model.items()}, None, lr=0.7, momentum=0.9)
    ckpt.save(tmp_path, 6, "A", {}, {"job": "t"}, extra=pack_state(OuterState(anchor, buf, 4)))
    ckpt.save(tmp_path, 12, "A", {}, {"job": "t"})  # a checkpoint without outer state cannot resume the outer step
    assert ckpt.local_steps(tmp_path, "A", [], extra=True) == [6] and ckpt.local_steps(tmp_path, "A", []) == [6, 12]
    got = unpack_state(ckpt.load_extra(ckpt.step_dir(tmp_path, 6), "A"), model)
    assert got.last_sync == 4 and ckpt.load_extra(ckpt.step_dir(tmp_path, 12), "A") is None
    for k in model:
        np.testing.assert_array_equal(got.anchor[k], anchor[k])
        np.testing.assert_array_equal(got.buf[k], buf[k])
        assert got.anchor[k].dtype == np.float32
    plain = unpack_state(pack_state(OuterState(anchor, None, 6)), model)  # averaging keeps no momentum
    assert plain.buf is None and plain.last_sync == 6
    ckpt.prune(tmp_path, "A", [], keep=1)
    assert not (ckpt.step_dir(tmp_path, 6)).exists()  # the outer state goes with its checkpoint


def test_outer_state_of_another_model_is_refused_naming_the_tensor():
    from nebula.dataparallel import OuterState, pack_state, unpack_state

    flat = pack_state(OuterState({"w": np.zeros((2, 3), np.float32)}, None, 5))
    with pytest.raises(ValueError, match=r"outer anchor 'w' has shape \(2, 3\), the model's \(3, 3\)"):
        unpack_state(flat, {"w": np.zeros((3, 3), np.float32)})
    with pytest.raises(ValueError, match=r"holds tensors \['w'\] but the model has \['v'\]"):
        unpack_state(flat, {"v": np.zeros((2, 3), np.float32)})
    with pytest.raises(ValueError, match="no last_sync"):
        unpack_state({}, {"w": np.zeros((2, 3), np.float32)})
