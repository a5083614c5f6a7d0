"""A recipe's train.yaml is checked like a job file: a typo or a wrong type is one line naming the file, the key and
the fix, from the recipe's real command line, with no traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nebula.config import ConfigError
from recipes.abnet.trainconfig import PRESET_NAMES, TrainConfig, load_train_config

REPO = Path(__file__).resolve().parents[2]


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("body,needles", [
    ("steps: 10\nbatch_szie: 8\n", ["unknown key batch_szie (did you mean batch_size?)", "allowed keys here"]),
    ("steps: many\n", ["steps: expected an integer, got 'many'"]),
])
@pytest.mark.parametrize("cli", [
    ["recipes.abnet.prepare", "base", "--side", "encoder", "--data", "data", "--work", "work"],
    ["recipes.abnet.remote", "reach", "--side", "decoder", "--worker", "worker.yaml", "--peer", "A", "--data", "d"],
], ids=["prepare", "remote"])
def test_bad_train_yaml_is_one_line_from_the_recipe_cli(tmp_path, cli, body, needles):
    train = tmp_path / "train.yaml"
    train.write_text(body)
    out = _cli([*cli, "--config", str(train)], tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f"error: {train}: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (tmp_path / "work").exists()  # refused before anything started


def test_train_yaml_values_and_overrides_name_their_key(tmp_path):
    train = tmp_path / "train.yaml"
    train.write_text(yaml.safe_dump({"preset": "tinny", "steps": 5}))
    with pytest.raises(ConfigError, match=r"train.yaml: preset: 'tinny' is not one of 'tiny', 'small', 'paper'"):
        load_train_config(train)
    train.write_text(yaml.safe_dump({"steps": 0}))
    with pytest.raises(ConfigError, match=r"train.yaml: <top>: steps=0: must be >= 1"):
        load_train_config(train)
    train.write_text(yaml.safe_dump({"steps": 5, "lr": 0.001}))
    with pytest.raises(ConfigError, match=r"train.yaml with pair='de-en': pair='de-en': expected 'en-<lang>'"):
        load_train_config(train, pair="de-en", steps=None)
    assert load_train_config(train, steps=7) == TrainConfig(steps=7, lr=0.001)


def test_train_yaml_presets_are_the_models_presets():
    from recipes.abnet.model import PRESETS

    assert set(PRESET_NAMES) == set(PRESETS)
    with pytest.raises(ValueError, match="preset='huge': choose one of tiny, small, paper"):
        TrainConfig(preset="huge")
