"""Downstream checks of a pretrained discriminator: cross-lingual transfer and sentence retrieval, per language.

* Transfer (the paper's XNLI protocol on catalog data): classify which software domain (catalog) a message comes
  from; fine-tune encoder + classifier on English messages of the training split, test on the held-out test split
  in every language (the translations of unseen English messages).
* Retrieval: for every language, embed the test sentences and their English originals (mean of the last layer, no
  fine-tuning) and find each sentence's English translation by cosine similarity (accuracy at 1).

`python -m recipes.electra.evaluate --data CORPUS --base cross=DIR --base english=DIR --random` compares encoders
(ABNet base directories, as `recipes.electra.prepare export` writes) against a randomly initialised one.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

__all__ = ["load_split", "domain_labels", "finetune_transfer", "retrieval", "main"]


def load_split(data: Path, split: str) -> list[dict]:
    """Rows {lang, en, text, domain} of one split."""
    return [json.loads(x) for x in (Path(data) / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]


def domain_labels(train: list[dict], num: int) -> list[str]:
    """The `num` most frequent domains of the English training messages."""
    counts = Counter(r["domain"] for r in {r["en"]: r for r in train}.values())
    return [d for d, _ in counts.most_common(num)]


def _embed(model, ids):
    """Mean of the last layer over real tokens: [B, H]."""
    from recipes.abnet.tokenizer import PAD_ID
    from recipes.electra.model import encode

    x = encode(model, ids)
    keep = (ids != PAD_ID).astype("float32").unsqueeze(-1)
    return (x * keep).sum(1) / keep.sum(1).clip(min=1.0)


def finetune_transfer(model, tok, train: list[dict], test: list[dict], labels: list[str], *, steps: int = 300,
                      batch: int = 32, lr: float = 5e-4, seed: int = 0, max_len: int = 32) -> dict[str, float]:
    """Fine-tune on English, return accuracy per test language (English included)."""
    import paddle
    import paddle.nn.functional as F

    paddle.seed(seed)
    rng = np.random.default_rng(seed)
    en = list({r["en"]: r for r in train if r["domain"] in labels}.values())
    x_en = [r["en"] for r in en]
    y_en = np.array([labels.index(r["domain"]) for r in en])
    head = paddle.nn.Linear(model.cfg.hidden, len(labels))
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=list(model.parameters()) + list(head.parameters()))
    model.train()
    for _ in range(steps):
        pick = rng.integers(0, len(x_en), batch)
        ids = paddle.to_tensor(tok.batch([x_en[i] for i in pick], max_len))
        loss = F.cross_entropy(head(_embed(model, ids)), paddle.to_tensor(y_en[pick]).unsqueeze(-1))
        loss.backward()
        opt.step()
        opt.clear_grad()
    model.eval()
    out: dict[str, float] = {}
    rows = [r for r in test if r["domain"] in labels]
    by_lang: dict[str, list[tuple[str, int]]] = {"en": list({r["en"]: (r["en"], labels.index(r["domain"]))
                                                             for r in rows}.values())}
    for r in rows:
        by_lang.setdefault(r["lang"], []).append((r["text"], labels.index(r["domain"])))
    with paddle.no_grad():
        for lang, items in by_lang.items():
            pred = []
            for i in range(0, len(items), 128):
                ids = paddle.to_tensor(tok.batch([t for t, _ in items[i:i + 128]], max_len))
                pred += head(_embed(model, ids)).numpy().argmax(1).tolist()
            out[lang] = float(np.mean(np.array(pred) == np.array([y for _, y in items])))
    return out


def retrieval(model, tok, test: list[dict], max_len: int = 32) -> dict[str, float]:
    """Accuracy at 1 of finding each test sentence's English original among that language's test originals."""
    import paddle

    out = {}
    model.eval()
    with paddle.no_grad():
        for lang in sorted({r["lang"] for r in test}):
            rows = [r for r in test if r["lang"] == lang]
            a = _embed(model, paddle.to_tensor(tok.batch([r["text"] for r in rows], max_len))).numpy()
            b = _embed(model, paddle.to_tensor(tok.batch([r["en"] for r in rows], max_len))).numpy()
            a /= np.linalg.norm(a, axis=1, keepdims=True) + 1e-9
            b /= np.linalg.norm(b, axis=1, keepdims=True) + 1e-9
            out[lang] = float(np.mean((a @ b.T).argmax(1) == np.arange(len(rows))))
    return out


def _encoder(spec: str, data: Path, preset_name: str, seed: int):
    import paddle

    from recipes.abnet.model import BertModel
    from recipes.abnet.pretrain import load_base
    from recipes.abnet.tokenizer import Tokenizer
    from recipes.electra.data import read_meta
    from recipes.electra.model import preset

    if spec == "random":
        meta = read_meta(data)
        paddle.seed(seed)
        cfg = preset(preset_name).discriminator.replace(vocab_size=int(meta["vocab_size"]),
                                                        max_positions=meta["max_len"])
        return BertModel(cfg), Tokenizer(Path(data) / "spm.model")
    return load_base(spec)


def main(argv: list[str] | None = None) -> int:
    """Evaluate every encoder given and print per-language tables (and JSON with --out)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="corpus directory (train/test.jsonl, spm.model, meta.json)")
    ap.add_argument("--base", action="append", default=[], help="NAME=DIR of an exported discriminator")
    ap.add_argument("--random", action="store_true", help="add a randomly initialised encoder of --preset")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--domains", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=2, help="fine-tuning repeats (mean accuracy)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    data = Path(args.data)
    train, test = load_split(data, "train"), load_split(data, "test")
    labels = domain_labels(train, args.domains)
    encoders = [tuple(b.split("=", 1)) for b in args.base] + ([("random", "random")] if args.random else [])
    results: dict[str, dict] = {}
    for name, spec in encoders:
        _, tok = _encoder(spec, data, args.preset, 0)
        model, _ = _encoder(spec, data, args.preset, 0)
        ret = retrieval(model, tok, test)
        accs = []
        for seed in range(args.seeds):
            model, _ = _encoder(spec, data, args.preset, seed)
            accs.append(finetune_transfer(model, tok, train, test, labels, steps=args.steps, seed=seed))
        transfer = {lang: float(np.mean([a[lang] for a in accs])) for lang in accs[0]}
        results[name] = {"transfer": transfer, "retrieval": ret}
    langs = sorted({lang for r in results.values() for lang in r["transfer"]}, key=lambda x: (x != "en", x))
    print(f"domains: {labels} (chance {1 / len(labels):.2f}); fine-tuned on English only, {args.steps} steps, "
          f"{args.seeds} seed(s)")
    for what in ("transfer", "retrieval"):
        print(f"\n{what} accuracy" + (" (domain classification)" if what == "transfer" else " at 1 (x -> en)"))
        print(f"{'encoder':<12}" + "".join(f"{lang:>8}" for lang in langs) + f"{'mean non-en':>13}")
        for name, r in results.items():
            vals = r[what]
            non_en = [vals[lang] for lang in langs if lang != "en" and lang in vals]
            print(f"{name:<12}" + "".join(f"{vals[lang]:>8.3f}" if lang in vals else f"{'-':>8}" for lang in langs)
                  + f"{np.mean(non_en):>13.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"labels": labels, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
