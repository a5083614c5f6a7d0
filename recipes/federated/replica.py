"""The language-identification model as a pipeline recipe of one stage, for `mode: data_parallel`: every cluster
trains a whole replica on its own share of the gettext messages (data.py) and the clusters average over the WAN.

`python -m recipes.federated.replica CKPT_STEP_DIR --data D` prints the held-out loss and accuracy of a checkpoint.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from nebula.pipeline import Recipe, Stage, StageContext
from recipes.federated.data import NUM_BUCKETS, densify, load_prepared
from recipes.federated.model import LangIdModel

__all__ = ["LangIdRecipe", "heldout", "heldout_of_checkpoint"]


class _LangIdStage(Stage):
    def __init__(self, r: "LangIdRecipe") -> None:
        self.r = r

    def build_model(self, ctx: StageContext) -> paddle.nn.Layer:
        """The MLP over hashed n-grams, seeded by the job (the same initial model in every cluster)."""
        return LangIdModel(NUM_BUCKETS, self.r.hidden, self.r.num_langs, seed=ctx.seed)

    def build_optimizer(self, model: paddle.nn.Layer, ctx: StageContext) -> paddle.optimizer.Optimizer:
        """AdamW (DiLoCo's inner optimizer) or plain SGD."""
        if self.r.optimizer == "sgd":
            return paddle.optimizer.SGD(learning_rate=self.r.lr, parameters=model.parameters())
        return paddle.optimizer.AdamW(learning_rate=self.r.lr, parameters=model.parameters(),
                                      weight_decay=self.r.weight_decay)

    def load(self, ids: np.ndarray, ctx: StageContext) -> Any:
        """Features and labels of training messages `ids`."""
        r = self.r
        return {"x": paddle.to_tensor(densify(r.indices, r.indptr, ids)), "y": paddle.to_tensor(r.labels[ids])}

    def forward(self, model: paddle.nn.Layer, batch: Any, received: Any) -> paddle.Tensor:
        """Mean cross-entropy of the micro-batch."""
        return F.cross_entropy(model(batch["x"]), batch["y"])


class LangIdRecipe(Recipe):
    """One stage, `model`; `data` is the .npz that `recipes.federated.data.prepare` writes."""

    stage_names = ("model",)

    def __init__(self, *, data: str, hidden: int = 64, lr: float = 3e-3, optimizer: str = "adamw",
                 weight_decay: float = 0.01) -> None:
        if optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer={optimizer!r} must be 'adamw' or 'sgd'")
        if not Path(data).is_file():
            raise ValueError(f"data={data!r} does not exist; write it with python -c \"from recipes.federated.data "
                             f"import prepare; prepare('{data}')\"")
        d = load_prepared(data)
        self.indices, self.indptr, self.labels = d["train_indices"], d["train_indptr"], d["train_labels"]
        self.num_examples, self.num_langs = len(self.labels), len(d["langs"])
        self.hidden, self.lr, self.optimizer, self.weight_decay = hidden, lr, optimizer, weight_decay

    def stage(self, name: str) -> Stage:
        """The only stage, `model`."""
        if name != "model":
            raise ValueError(f"stage {name!r}: this recipe has one stage, 'model'")
        return _LangIdStage(self)


def heldout(model: paddle.nn.Layer, d: dict) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of `model` on the held-out test split of prepared data `d`."""
    x = densify(d["test_indices"], d["test_indptr"], np.arange(len(d["test_labels"])))
    model.eval()
    with paddle.no_grad():
        logits = model(paddle.to_tensor(x))
        loss = float(F.cross_entropy(logits, paddle.to_tensor(d["test_labels"])))
    return loss, float((logits.numpy().argmax(-1) == d["test_labels"]).mean())


def heldout_of_checkpoint(step_dir: str | Path, data: str, hidden: int = 64) -> tuple[float, float]:
    """Held-out (loss, accuracy) of the `model` stage saved in checkpoint directory `step_dir`."""
    d = load_prepared(data)
    model = LangIdModel(NUM_BUCKETS, hidden, len(d["langs"]))
    model.set_state_dict(paddle.load(str(Path(step_dir) / "model" / "model.pdparams")))
    return heldout(model, d)


def main() -> None:
    """Print a checkpoint's held-out loss and accuracy."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("step_dir")
    p.add_argument("--data", required=True)
    p.add_argument("--hidden", type=int, default=64)
    a = p.parse_args()
    loss, acc = heldout_of_checkpoint(a.step_dir, a.data, a.hidden)
    print(f"held-out loss {loss:.4f} accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
