"""Training text for a causal LM: one example per line of a UTF-8 file, tokenized by the checkpoint's tokenizer.

The tokenizer is read from the checkpoint directory's own files (`tokenizer.json` / `tokenizer_config.json`, as
the library's `save_pretrained` writes them); nothing is downloaded. Each line becomes `seq_len` token ids: its
tokens and the end-of-text token, cut or right-padded; labels are the same ids with padding set to IGNORE_INDEX.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from nebula.formers.checkpoint import FormersError, require_formers
from nebula.formers.layers import IGNORE_INDEX

__all__ = ["TokenData", "load_tokenizer", "read_lines", "TOKENIZER_FILES"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt")


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved in checkpoint directory `path` (FormersError when it holds no tokenizer files)."""
    d = Path(path)
    if not any((d / f).is_file() for f in TOKENIZER_FILES):
        raise FormersError(f"from_pretrained: {d} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the "
                           "tokenizer into the same directory with tokenizer.save_pretrained(DIR)")
    pft = require_formers()
    return pft.AutoTokenizer.from_pretrained(str(d))


def read_lines(path: str | Path, key: str = "data") -> list[str]:
    """The non-empty lines of a UTF-8 text file, stripped; FormersError naming the file when there are none."""
    p = Path(path)
    try:
        lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise FormersError(f"{key}: cannot read {p} ({exc}); give a UTF-8 text file, one example per line") from None
    lines = [ln for ln in lines if ln]
    if not lines:
        raise FormersError(f"{key}: {p} has no non-empty line; give one training example per line")
    return lines


class TokenData:
    """Fixed-length token ids and labels of every example (ids 0..num_examples-1)."""

    def __init__(self, texts: Sequence[str], tokenizer: Any, seq_len: int) -> None:
        if seq_len < 2:
            raise FormersError(f"seq_len={seq_len} must be >= 2 (a next token to predict)")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise FormersError("the checkpoint's tokenizer has neither a pad nor an end-of-text token; set one and "
                               "save it again")
        eos = tokenizer.eos_token_id
        ids = np.full((len(texts), seq_len), int(pad), dtype="int64")
        labels = np.full((len(texts), seq_len), IGNORE_INDEX, dtype="int64")
        for i, enc in enumerate(tokenizer(list(texts), add_special_tokens=False)["input_ids"]):
            row = (list(enc) + ([eos] if eos is not None else []))[:seq_len]
            ids[i, : len(row)] = row
            labels[i, : len(row)] = row
        self._ids, self._labels = ids, labels
        self.seq_len = seq_len
        self.num_examples = len(texts)
        self.num_tokens = int((labels != IGNORE_INDEX).sum())

    def tokens(self, ids: np.ndarray) -> np.ndarray:
        """Token ids of examples `ids`: [len(ids), seq_len] int64."""
        return self._ids[np.asarray(ids, dtype="int64")]

    def labels(self, ids: np.ndarray) -> np.ndarray:
        """Labels of examples `ids` (IGNORE_INDEX on padding)."""
        return self._labels[np.asarray(ids, dtype="int64")]
