"""Fixtures of the library-model tests: gettext lines and tiny random checkpoints written by the library itself.

Every test here needs the `formers` extra (PaddleFormers); without it they are skipped with that reason, and CI
installs the extra so that they run.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

HAVE_FORMERS = importlib.util.find_spec("paddleformers") is not None
NEEDS_FORMERS = pytest.mark.skipif(not HAVE_FORMERS, reason="needs the formers extra (PaddleFormers): "
                                                            "pip install -e '.[formers]'")
SEQ_LEN = 24


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """60 gettext messages per language (de, es, fr), one per line."""
    from recipes.llm.prepare import gettext_lines

    path = tmp_path_factory.mktemp("corpus") / "train.txt"
    path.write_text("\n".join(gettext_lines(per_lang=60)) + "\n", encoding="utf-8")
    return path


def _tiny(tmp_path_factory, corpus_file: Path, family: str, **kw) -> Path:
    from recipes.llm.prepare import save_tiny

    lines = corpus_file.read_text(encoding="utf-8").splitlines()
    return save_tiny(tmp_path_factory.mktemp(family) / "ckpt", lines, family=family, vocab_size=300, hidden=32,
                     intermediate=64, **kw)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory, corpus_file) -> Path:
    """A tiny random Llama (4 decoder layers, hidden 32) and its tokenizer, saved with save_pretrained."""
    return _tiny(tmp_path_factory, corpus_file, "llama", layers=4)


@pytest.fixture(scope="session")
def ernie_dir(tmp_path_factory, corpus_file) -> Path:
    """A tiny random ERNIE-4.5 (2 decoder layers) and its tokenizer."""
    return _tiny(tmp_path_factory, corpus_file, "ernie4_5", layers=2)


def llm_job(tmp: Path, ckpt: Path, data: Path, *, clusters: list[dict], stages: list[dict] | None = None,
            steps: int = 6, global_batch: int = 8, micro_batches: int = 2, recipe_args: dict | None = None,
            name: str = "job.yaml", **extra) -> Path:
    """Write a job file training the checkpoint with `nebula.formers:CausalLMRecipe`; its path."""
    args = {"from_pretrained": str(ckpt), "data": str(data), "seq_len": SEQ_LEN, "lr": 0.003, **(recipe_args or {})}
    doc = {"job": "llm", "recipe": {"factory": "nebula.formers:CausalLMRecipe", "args": args},
           "clusters": clusters, **({"stages": stages} if stages is not None else {}),
           "train": {"steps": steps, "global_batch": global_batch, "micro_batches": micro_batches, "seed": 1},
           "metrics": {"dir": "metrics", "progress": False}, **extra}
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


ONE_PROCESS = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "A"}]
TWO_CLUSTERS = [{"name": "embed", "cluster": "A"}, {"name": "head", "cluster": "B"}]
