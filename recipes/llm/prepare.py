"""Data and a tiny Llama-shaped checkpoint for the LLM recipe, written with the library's own `save_pretrained`.

`python -m recipes.llm.prepare OUT` writes `OUT/train.txt` (gettext messages of the machine's catalogs, one per
line, grouped by language) and `OUT/tiny-llama/` (config.json, safetensors, tokenizer.json): a byte-level BPE
tokenizer trained on those lines and a randomly initialised model with the fused kernels off, the stand-in for a
team's own checkpoint directory. `save_tiny` makes the same for any supported family (tests: llama, ernie4_5).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["gettext_lines", "train_tokenizer", "save_tiny", "prepare", "LANGS"]

LANGS = ("de", "es", "fr")
_CONFIGS = {"llama": "LlamaConfig", "ernie4_5": "Ernie4_5Config"}
_MODELS = {"llama": "LlamaForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM"}


def gettext_lines(langs: Sequence[str] = LANGS, per_lang: int = 400) -> list[str]:
    """Translated gettext messages of the machine's catalogs, `per_lang` per language, one language after another."""
    from recipes.text.catalogs import load_corpus

    corpus = load_corpus(tuple(langs), max_per_lang=per_lang)
    return [t for lang in langs for t in corpus[lang]]


def train_tokenizer(texts: Sequence[str], vocab_size: int = 512):
    """A byte-level BPE tokenizer trained on `texts` (pad, bos, eos specials: ids 0, 1, 2), as the library's
    fast-tokenizer class, so `save_pretrained` writes tokenizer.json and `AutoTokenizer` reads it back."""
    from paddleformers.transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def save_tiny(out: str | Path, texts: Sequence[str], *, family: str = "llama", vocab_size: int = 512,
              hidden: int = 64, layers: int = 4, heads: int = 4, kv_heads: int = 2, intermediate: int = 128,
              max_positions: int = 128, seed: int = 0) -> Path:
    """A tiny random `family` model and its tokenizer saved into `out` with the library's save_pretrained."""
    import paddle
    import paddleformers.transformers as pft

    tok = train_tokenizer(texts, vocab_size)
    config = getattr(pft, _CONFIGS[family])(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
        max_position_embeddings=max_positions, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, fuse_rms_norm=False, use_fused_rope=False,
        use_flash_attention=False, fuse_attention_qkv=False, fuse_swiglu=False)
    paddle.seed(seed)
    model = getattr(pft, _MODELS[family])(config)
    out = Path(out)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def prepare(out: str | Path, *, per_lang: int = 400, langs: Sequence[str] = LANGS, **model: int) -> Path:
    """Write OUT/train.txt and OUT/tiny-llama; return OUT."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = gettext_lines(langs, per_lang)
    (out / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    save_tiny(out / "tiny-llama", lines, **model)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m recipes.llm.prepare OUT [--per-lang N] [--layers L]`."""
    ap = argparse.ArgumentParser(prog="python -m recipes.llm.prepare", description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--per-lang", type=int, default=400, help="gettext messages per language")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers of the tiny model")
    args = ap.parse_args(argv)
    try:
        out = prepare(args.out, per_lang=args.per_lang, layers=args.layers)
    except (FileNotFoundError, ImportError) as exc:
        print(f"recipes.llm.prepare: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'train.txt'} and {out / 'tiny-llama'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
