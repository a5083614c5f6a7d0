"""BLEU (sacrebleu, case-insensitive) and loss-curve plots."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

__all__ = ["bleu", "plot_losses"]


def bleu(hypotheses: Sequence[str], references: Sequence[str], target_lang: str = "es") -> float:
    """Corpus BLEU, case-insensitive as in ABNet; Chinese uses sacrebleu's 'zh' tokenizer."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references; they must pair up")
    tokenize = "zh" if target_lang.startswith("zh") else "13a"
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], lowercase=True, tokenize=tokenize).score)


def plot_losses(curves: Mapping[str, Sequence[float]], out_png: str | Path, title: str = "ABNet training loss",
                smooth: int = 20) -> Path:
    """Write a PNG of one or more loss curves (moving average over `smooth` steps)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in curves.items():
        v = np.asarray(values, dtype=float)
        if v.size == 0:
            continue
        k = max(1, min(smooth, v.size // 5 or 1))
        sm = np.convolve(v, np.ones(k) / k, mode="valid")
        ax.plot(np.arange(k, v.size + 1), sm, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
