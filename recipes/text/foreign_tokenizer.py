"""The tokenizers of PaddleNLP checkpoints, read from their files: BERT's WordPiece (vocab.txt) and ERNIE-M's
sentencepiece model with its vocab.txt. Ids are the checkpoint's, permuted so that its [PAD], [UNK], [MASK] and
[CLS] take the recipe's fixed ids 0-3 (`special_permutation`); the loader permutes the embedding rows alike."""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Sequence

import numpy as np

from recipes.text.tokenizer import NUM_SPECIAL, TokenizerBase

__all__ = ["special_permutation", "read_vocab", "special_tokens", "WordPieceTokenizer", "ErnieMTokenizer",
           "VOCAB_FILE", "SPM_FILE"]

VOCAB_FILE, SPM_FILE = "vocab.txt", "sentencepiece.bpe.model"
# the recipe's special ids 0..3 in order, with PaddleNLP's tokenizer_config.json keys and default tokens
SPECIALS = (("pad_token", "[PAD]"), ("unk_token", "[UNK]"), ("mask_token", "[MASK]"), ("cls_token", "[CLS]"))


def special_permutation(vocab_size: int, special_ids: Sequence[int]) -> np.ndarray:
    """to_ckpt[recipe id] = checkpoint id: the 4 special ids first (pad, unk, mask, cls), then the others in order."""
    if len(set(special_ids)) != len(special_ids) or not all(0 <= i < vocab_size for i in special_ids):
        raise ValueError(f"special ids {list(special_ids)} must be distinct and below vocab_size={vocab_size}")
    rest = np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids, dtype=np.int64))
    return np.concatenate([np.asarray(special_ids, dtype=np.int64), rest])


def read_vocab(path: Path) -> list[str]:
    """vocab.txt as PaddleNLP writes it: one token per line, its id the line number."""
    lines = path.read_text(encoding="utf-8").split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def special_tokens(d: Path) -> tuple[list[str], bool | None]:
    """The pad, unk, mask and cls token strings and do_lower_case (None: not given), from tokenizer_config.json /
    special_tokens_map.json when present (PaddleNLP's default tokens otherwise)."""
    conf: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        f = d / name
        if f.is_file():
            conf.update(json.loads(f.read_text()))
    tokens = []
    for key, default in SPECIALS:
        v = conf.get(key, default)
        tokens.append(v.get("content", default) if isinstance(v, dict) else str(v))
    lower = conf.get("do_lower_case")
    return tokens, None if lower is None else bool(lower)


class _VocabTokenizer(TokenizerBase):
    """Token strings <-> checkpoint ids from vocab.txt, mapped to recipe ids by the special permutation."""

    def __init__(self, d: Path, lower_default: bool) -> None:
        self.path = d / VOCAB_FILE
        if not self.path.is_file():
            raise FileNotFoundError(f"{d} has no {VOCAB_FILE}; a PaddleNLP checkpoint directory keeps its tokenizer "
                                    "beside the weights (tokenizer.save_pretrained(dir))")
        self.tokens = read_vocab(self.path)
        index = {t: i for i, t in enumerate(self.tokens)}
        self.specials, lower = special_tokens(d)
        self.lower = lower_default if lower is None else lower  # BertTokenizer lower-cases unless told not to
        missing = [t for t in self.specials if t not in index]
        if missing:
            raise ValueError(f"{self.path} lacks the special token(s) {missing}; the vocabulary does not belong to "
                             "this tokenizer configuration (tokenizer_config.json)")
        self.to_ckpt = special_permutation(len(self.tokens), [index[t] for t in self.specials])
        self.to_recipe = np.argsort(self.to_ckpt)
        self.index = index
        self.unk = index[self.specials[1]]
        self.skip = {index[t] for t in self.specials} | {i for t, i in index.items() if t in ("[SEP]", "</s>", "<s>")}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def pieces(self, text: str) -> list[str]:
        """The token strings of `text`, as the checkpoint's tokenizer splits it."""
        raise NotImplementedError

    def encode(self, text: str, max_len: int | None = None) -> list[int]:
        ids = [int(self.to_recipe[self.index.get(p, self.unk)]) for p in self.pieces(text)]
        return ids[:max_len] if max_len else ids

    def tokens_of(self, ids: Sequence[int]) -> list[str]:
        """Token strings of recipe ids, special tokens dropped."""
        out = []
        for i in ids:
            if int(i) < NUM_SPECIAL or not 0 <= int(i) < len(self.tokens):
                continue
            c = int(self.to_ckpt[int(i)])
            if c not in self.skip:
                out.append(self.tokens[c])
        return out


def _is_punct(c: str) -> bool:
    o = ord(c)
    return 33 <= o <= 47 or 58 <= o <= 64 or 91 <= o <= 96 or 123 <= o <= 126 or \
        unicodedata.category(c).startswith("P")


def _is_cjk(c: str) -> bool:
    o = ord(c)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2A6DF or 0x2A700 <= o <= 0x2CEAF
            or 0xF900 <= o <= 0xFAFF or 0x2F800 <= o <= 0x2FA1F)


class WordPieceTokenizer(_VocabTokenizer):
    """BERT's tokenizer (PaddleNLP BertTokenizer): basic splitting (whitespace, punctuation, CJK characters,
    optional lower-casing with accents stripped), then greedy longest-match WordPiece with '##' continuations."""

    def __init__(self, d: Path) -> None:
        super().__init__(d, lower_default=True)

    def _words(self, text: str) -> list[str]:
        text = "".join(" " if c.isspace() else c for c in text
                       if not (ord(c) in (0, 0xFFFD) or unicodedata.category(c) in ("Cc", "Cf") and not c.isspace()))
        text = "".join(f" {c} " if _is_cjk(c) else c for c in text)
        words = []
        for w in text.split():
            if self.lower:
                w = "".join(c for c in unicodedata.normalize("NFD", w.lower()) if unicodedata.category(c) != "Mn")
            cur = ""
            for c in w:
                if _is_punct(c):
                    words += [cur, c] if cur else [c]
                    cur = ""
                else:
                    cur += c
            if cur:
                words.append(cur)
        return words

    def pieces(self, text: str) -> list[str]:
        out = []
        for w in self._words(text):
            if len(w) > 100:
                out.append(self.specials[1])
                continue
            start, sub = 0, []
            while start < len(w):
                end = len(w)
                while end > start and (("##" if start else "") + w[start:end]) not in self.index:
                    end -= 1
                if end == start:
                    sub = [self.specials[1]]
                    break
                sub.append(("##" if start else "") + w[start:end])
                start = end
            out += sub
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.tokens_of(ids)).replace(" ##", "").strip()


class ErnieMTokenizer(_VocabTokenizer):
    """ERNIE-M's tokenizer (PaddleNLP ErnieMTokenizer): sentencepiece.bpe.model pieces, split further at CJK
    characters, punctuation and digit boundaries, looked up in vocab.txt."""

    def __init__(self, d: Path) -> None:
        import sentencepiece as spm

        super().__init__(d, lower_default=False)
        model = d / SPM_FILE
        if not model.is_file():
            raise FileNotFoundError(f"{d} has no {SPM_FILE}; an ERNIE-M tokenizer needs it beside {VOCAB_FILE}")
        self.sp = spm.SentencePieceProcessor(model_file=str(model))
        self.fullwidth = {chr(c): chr(c - 65248) for c in range(65281, 65375) if chr(c) != "～"}

    def pieces(self, text: str) -> list[str]:
        text = "".join(self.fullwidth.get(c, c) for c in text)
        if self.lower:
            text = text.lower()
        out = []
        for piece in self.sp.encode(text, out_type=str):
            if piece == "▁":
                continue
            last = 0
            for i, c in enumerate(piece):
                if c == "▁":
                    continue
                cut = _is_cjk(c) or _is_punct(c)
                if cut or (i > 0 and c.isdigit() != piece[i - 1].isdigit()):
                    if i > last and piece[last:i] != "▁":
                        out.append(piece[last:i])
                    if cut:
                        out.append(c)
                        last = i + 1
                    else:
                        last = i
            if len(piece) > last:
                out.append(piece[last:])
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self.tokens_of(ids)).replace("▁", " ").strip()
