"""One sentencepiece tokenizer per side, trained on that side's training split only."""
from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Sequence

import numpy as np

from security._files import PUBLIC, atomic_write

__all__ = ["TokenizerBase", "Tokenizer", "train_tokenizer", "PAD_ID", "UNK_ID", "MASK_ID", "CLS_ID", "NUM_SPECIAL"]

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, MASK_ID, CLS_ID = 0, 1, 2, 3
NUM_SPECIAL = 4


class TokenizerBase:
    """What the recipe needs of a tokenizer: ids with pad 0, unk 1, [MASK] 2, [CLS] 3 (NUM_SPECIAL below 4)."""

    @property
    def vocab_size(self) -> int:
        """Number of ids, special ones included."""
        raise NotImplementedError

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        """Ids of `text` (no special tokens added), truncated to `max_len`."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special ids dropped."""
        raise NotImplementedError

    def batch(self, texts: Sequence[str], max_len: int) -> np.ndarray:
        """int64 [len(texts), max_len] array of ids, right-padded with PAD_ID (length = longest, capped)."""
        rows = [self.encode(t, max_len) or [UNK_ID] for t in texts]
        width = max(len(r) for r in rows)
        out = np.full((len(rows), width), PAD_ID, dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out


class Tokenizer(TokenizerBase):
    """A sentencepiece model with fixed special ids: pad 0, unk 1, [MASK] 2, [CLS] 3."""

    def __init__(self, model_file: str | Path) -> None:
        import sentencepiece as spm

        path = Path(model_file)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer model {path} not found; train it with train_tokenizer() first")
        self.path = path
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        if self.sp.piece_to_id("[MASK]") != MASK_ID or self.sp.pad_id() != PAD_ID:
            raise ValueError(f"{path}: special ids differ from pad=0 unk=1 [MASK]=2 [CLS]=3; retrain with train_tokenizer()")

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special ones included."""
        return self.sp.get_piece_size()

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        """Piece ids of `text`, truncated to `max_len`."""
        ids = self.sp.encode(text)
        return ids[:max_len] if max_len else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; pad, mask and cls ids are dropped."""
        return self.sp.decode([int(i) for i in ids if int(i) >= NUM_SPECIAL])


def train_tokenizer(texts: Sequence[str], out_file: str | Path, vocab_size: int = 1000,
                    character_coverage: float = 1.0) -> Tokenizer:
    """Train a unigram sentencepiece model on `texts` and write it to `out_file` (…/name.model)."""
    import sentencepiece as spm

    if not texts:
        raise ValueError("train_tokenizer: no texts given; the training split of this side is empty")
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    # A small corpus cannot fill a large vocabulary: sentencepiece fails with "Vocabulary size too high";
    # hard_vocab_limit=False turns that into a smaller vocabulary instead.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        eos_id=-1,
        user_defined_symbols=["[MASK]", "[CLS]"],
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    atomic_write(out, buf.getvalue(), PUBLIC)
    log.info("tokenizer %s: %d pieces", out, vocab_size)
    return Tokenizer(out)
