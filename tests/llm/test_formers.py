"""PaddleFormers causal LMs as layered models: each family built from a checkpoint its own save_pretrained wrote,
the layers computing what the library's model computes, local directories only, kernels per device."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from nebula.config import ConfigError
from nebula.formers import CausalLMRecipe, FormersError, kernel_choice, resolve_pretrained
from nebula.hybrid.layered import build_layers
from tests.llm.conftest import NEEDS_FORMERS, ONE_PROCESS, SEQ_LEN, llm_job

pytestmark = NEEDS_FORMERS


def _layers_match_the_library(ckpt, corpus_file) -> None:
    """Layer by layer, the recipe's model gives the logits of the library's own model loaded by from_pretrained,
    and its loss is the library criterion's on the shifted labels; a backward pass reaches every parameter."""
    import paddle
    from paddleformers.transformers import AutoModelForCausalLM

    r = CausalLMRecipe(from_pretrained=str(ckpt), data=str(corpus_file), seq_len=SEQ_LEN)
    m = r.layered()
    assert m.names() == ["embed", *(f"decoder{i}" for i in range(m.num_hidden_layers)), "norm", "head"]
    layers = build_layers(m, 0, m.num_layers, seed=0)
    ids = np.arange(6)
    x = m.inputs(ids)
    for layer in layers:
        x = layer(x)
    loss = m.loss(x, m.targets(ids))
    lib = AutoModelForCausalLM.from_pretrained(str(ckpt))
    lib.eval()
    inp, lab = m.inputs(ids), m.targets(ids)
    np.testing.assert_allclose(x.numpy(), lib(inp, return_dict=True).logits.numpy(), rtol=1e-5, atol=1e-5)
    ref = lib(inp[:, :-1], labels=lab[:, 1:], return_dict=True).loss
    assert float(loss) == pytest.approx(float(ref), rel=1e-5)
    loss.backward()
    assert all(p.grad is not None and float(paddle.abs(p.grad).sum()) > 0 for layer in layers
               for p in layer.parameters())
    assert (r.data.labels(ids) == -100).any()  # padded positions exist and are ignored


def test_llama_checkpoint_as_layers_computes_the_library_model(llama_dir, corpus_file):
    assert json.loads((llama_dir / "config.json").read_text())["model_type"] == "llama"
    assert list(llama_dir.glob("*.safetensors")) and (llama_dir / "tokenizer.json").is_file()
    _layers_match_the_library(llama_dir, corpus_file)


def test_ernie45_checkpoint_as_layers_computes_the_library_model(ernie_dir, corpus_file):
    assert json.loads((ernie_dir / "config.json").read_text())["model_type"] == "ernie4_5"
    _layers_match_the_library(ernie_dir, corpus_file)


def test_qwen2_and_qwen3_are_refused_with_the_reason_the_library_gives(tmp_path, llama_dir, corpus_file):
    """They do not build with PaddleFormers 1.2.0 (paddlefleet is not on the index): the job says so in one line,
    and the claim is checked against the library itself (a release that builds them fails this test)."""
    import paddleformers.transformers as pft

    for name in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        with pytest.raises(ImportError, match="paddlefleet"):
            getattr(pft, name)
    d = tmp_path / "qwen2"
    shutil.copytree(llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(FormersError) as err:
        CausalLMRecipe(from_pretrained=str(d), data=str(corpus_file))
    msg = str(err.value)
    assert "\n" not in msg and "qwen2" in msg and "paddlefleet" in msg and "llama" in msg


def test_a_hub_name_gets_one_line_and_no_network(tmp_path, monkeypatch, corpus_file):
    import socket

    def no_network(*a, **k):
        raise AssertionError("tried the network")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FormersError) as err:
        resolve_pretrained("meta-llama/Llama-2-7b-hf")
    msg = str(err.value)
    assert "\n" not in msg and "local checkpoints only" in msg and "download" in msg
    assert "set from_pretrained to that directory" in msg
    # through a job file: the recipe's args are refused before training, naming the key
    job = llm_job(tmp_path, "meta-llama/Llama-2-7b-hf", corpus_file, clusters=[{"id": "A"}], stages=ONE_PROCESS)
    from nebula.config.job import load_job_config
    from nebula.pipeline.stage import load_recipe

    with pytest.raises(ConfigError, match="from_pretrained: 'meta-llama/Llama-2-7b-hf' looks like a model hub name"):
        load_recipe(load_job_config(job).recipe)


def test_checkpoint_directory_problems_are_named(tmp_path, llama_dir, corpus_file):
    with pytest.raises(FormersError, match="is not a directory"):
        resolve_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormersError, match="has no config.json"):
        resolve_pretrained(tmp_path / "empty")
    d = tmp_path / "notok"
    shutil.copytree(llama_dir, d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    with pytest.raises(FormersError, match="has no tokenizer files"):
        CausalLMRecipe(from_pretrained=str(d), data=str(corpus_file))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(FormersError, match="has no non-empty line"):
        CausalLMRecipe(from_pretrained=str(llama_dir), data=str(empty))


def test_kernels_are_chosen_per_device_and_fused_ones_are_off_on_cpu(tmp_path, llama_dir, corpus_file):
    """A checkpoint saved with the fused kernels on (as a GPU team would) trains on CPU with them off."""
    assert kernel_choice("auto", "cpu") == "plain" and kernel_choice("auto", "gpu:0") == "checkpoint"
    assert kernel_choice({"gpu": "plain"}, "gpu:1") == "plain" and kernel_choice({"gpu": "plain"}, "npu") == \
        "checkpoint"
    with pytest.raises(FormersError, match="kernels for cpu: 'fast'"):
        kernel_choice({"cpu": "fast"}, "cpu")
    d = tmp_path / "fused"
    shutil.copytree(llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "use_flash_attention": True, "fuse_rms_norm": True,
                                               "use_fused_rope": True, "fuse_swiglu": True}))
    r = CausalLMRecipe(from_pretrained=str(d), data=str(corpus_file), seq_len=SEQ_LEN)
    m = r.layered()
    assert not m.config.use_flash_attention and not m.config.fuse_rms_norm
    x = m.inputs(np.arange(2))
    for layer in build_layers(m, 0, m.num_layers, 0):
        x = layer(x)
    assert np.isfinite(float(m.loss(x, m.targets(np.arange(2)))))


def test_one_process_pipeline_learns_and_any_cut_trains_like_the_whole(tmp_path, llama_dir, corpus_file):
    """The runtime trains the model in stages; cutting it elsewhere (or not at all) gives the same losses."""
    from nebula.config.job import load_job_config
    from nebula.modes import run

    def losses(name, **args):
        job = llm_job(tmp_path / name, llama_dir, corpus_file, steps=8, clusters=[{"id": "A"}],
                      stages=[{"name": n, "cluster": "A"} for n in args.get("stage_names", ("embed", "head"))],
                      recipe_args=args)
        return run(load_job_config(job), "A").losses

    even = losses("even")
    other = losses("other", bounds=[0, 4, 7])
    whole = losses("whole", stage_names=["model"])
    np.testing.assert_allclose([even[s] for s in range(8)], [other[s] for s in range(8)], rtol=1e-5)
    np.testing.assert_allclose([even[s] for s in range(8)], [whole[s] for s in range(8)], rtol=1e-5)
    assert np.mean([even[s] for s in range(6, 8)]) < np.mean([even[s] for s in range(2)]) - 0.3


def test_clusters_reading_one_checkpoint_at_once_all_load_and_leave_it_untouched(tmp_path, llama_dir):
    """The library's loader deletes and rewrites an index file in the directory it reads: processes reading one
    checkpoint at once (the ranks and clusters of a job on a shared file system) broke each other's load."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    d = tmp_path / "shared"
    shutil.copytree(llama_dir, d)
    before = {f.name: f.stat().st_mtime_ns for f in d.iterdir()}
    code = ("import sys; from nebula.formers.loading import _load\n"
            "for _ in range(2):\n    _load.cache_clear(); _load(sys.argv[1], 'plain', False)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ps = [subprocess.Popen([sys.executable, "-c", code, str(d)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=180)[0] for p in ps]
    assert [p.returncode for p in ps] == [0, 0, 0], [o[-2000:] for o in outs]
    assert {f.name: f.stat().st_mtime_ns for f in d.iterdir()} == before
