"""Load a local checkpoint into the library's causal-LM class, with the kernels the device can run.

PaddleFormers reads its safetensors through Paddle's flex checkpoint, which converts the on-disk layout and, in a
process of a `paddle.distributed` job (world size > 1), synchronises the ranks with barriers and all-gathers (and
initialises the default process group itself when it is not yet). Nebula's ranks set up their groups in a fixed
order and build different layers at different times, so there the checkpoint is read by a short child process
outside the job (`python -m nebula.formers.loading`), which hands the converted weights back as a Paddle state dict.
Every load reads the checkpoint through a private directory of links to its files (`_mirror`): the loader writes
into the directory it reads, which would break concurrent loads of one checkpoint and read-only checkpoints.
"""
from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from nebula.formers.checkpoint import CheckpointInfo, FormersError, require_formers, resolve_pretrained
from nebula.formers.families import KERNEL_FLAGS, family_of

__all__ = ["kernel_choice", "load_config", "load_causal_lm", "KERNEL_CHOICES"]

KERNEL_CHOICES = ("plain", "checkpoint")  # plain: every fused kernel off; checkpoint: as config.json says
_DEFAULT_KERNELS = {"cpu": "plain"}  # other devices: the checkpoint's own choice


def kernel_choice(kernels: str | Mapping[str, str], device: str) -> str:
    """`plain` or `checkpoint` for `device` (cpu, gpu, npu, xpu) from a recipe's `kernels` (auto, one choice, or
    a mapping device -> choice); FormersError naming the bad value."""
    dev = device.split(":")[0]
    if kernels == "auto":
        return _DEFAULT_KERNELS.get(dev, "checkpoint")
    if isinstance(kernels, str):
        choice = kernels
    elif isinstance(kernels, Mapping):
        choice = kernels.get(dev, _DEFAULT_KERNELS.get(dev, "checkpoint"))
    else:
        raise FormersError(f"kernels={kernels!r} must be auto, plain, checkpoint or a mapping device -> one of them")
    if choice not in KERNEL_CHOICES:
        raise FormersError(f"kernels for {dev}: {choice!r} is not one of auto, {', '.join(KERNEL_CHOICES)}")
    return choice


def load_config(info: CheckpointInfo, kernels: str) -> Any:
    """The library's config object of the checkpoint, fused kernels off when `kernels` is plain."""
    pft = require_formers()
    fam = family_of(info.model_type)
    config = getattr(pft, fam.config).from_pretrained(str(info.path))
    if kernels == "plain":
        for flag in KERNEL_FLAGS:
            setattr(config, flag, False)
    return config


def _distributed() -> bool:
    import paddle.distributed as dist

    return dist.get_world_size() > 1


@functools.lru_cache(maxsize=2)
def _load(path: str, kernels: str, distributed: bool) -> Any:
    import paddle

    pft = require_formers()
    info = resolve_pretrained(path)
    config = load_config(info, kernels)
    cls = getattr(pft, family_of(info.model_type).causal_lm)
    if not distributed:
        with _mirror(info.path) as d, _quiet():
            return cls.from_pretrained(d, config=config)
    with tempfile.TemporaryDirectory(prefix="nebula-formers-") as tmp:
        out = Path(tmp) / "model.pdparams"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLAGS_selected_"))}
        env["CUDA_VISIBLE_DEVICES"] = ""  # the conversion runs on the host
        proc = subprocess.run([sys.executable, "-m", "nebula.formers.loading", str(info.path), kernels, str(out)],
                              env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise FormersError(f"from_pretrained: reading {info.path} failed in the loader process: {tail[0]}")
        state = paddle.load(str(out))
    with _quiet():
        model = cls(config)
    missing, unexpected = model.set_state_dict(state)
    if missing:
        raise FormersError(f"from_pretrained: {info.path} lacks weights {sorted(missing)[:3]}; the checkpoint does "
                           "not match its config.json")
    return model


def load_causal_lm(path: str | Path, kernels: str = "plain") -> Any:
    """The whole causal LM of checkpoint directory `path` (read once per process and kept): do not train it in
    place, copy the layers you need (`nebula.formers.layers`)."""
    if kernels not in KERNEL_CHOICES:
        raise FormersError(f"kernels={kernels!r} must be one of {', '.join(KERNEL_CHOICES)}")
    return _load(str(Path(path).resolve()), kernels, _distributed())


@contextlib.contextmanager
def _mirror(path: Path):
    """A private directory of links to the checkpoint's files: the library's loader deletes and rewrites an index
    file (flex-ckpt.auto_generated.metadata) in the directory it reads, so two processes reading one checkpoint at
    once break each other's load, and a read-only checkpoint cannot be read. Each load gets its own."""
    with tempfile.TemporaryDirectory(prefix="nebula-ckpt-") as tmp:
        for f in path.iterdir():
            if f.is_file() and not f.name.endswith(".metadata"):
                os.symlink(f.resolve(), Path(tmp) / f.name)
        yield tmp


@contextlib.contextmanager
def _quiet():
    """PaddleFormers logs every weight it reads at INFO; keep a job's log to its own lines."""
    import logging

    lg = logging.getLogger("paddleformers")
    level = lg.level
    lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        lg.setLevel(level)


def _main(argv: list[str]) -> int:
    """Loader process: read checkpoint argv[0] with kernels argv[1], write its Paddle state dict to argv[2]."""
    import paddle

    paddle.set_device("cpu")
    model = _load(argv[0], argv[1], False)
    paddle.save(model.state_dict(), argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
