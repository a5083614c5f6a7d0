"""CLI: build the multilingual corpus and give each cluster its part; export the discriminator as an ABNet base.

`python -m recipes.electra.prepare data --out RUN [--groups 'a=es,fr;b=ru'] [--max-per-language N]`
writes RUN/corpus (every split, the shared tokenizer, every group's examples), then RUN/<G>/data for each generator
cluster (its own group's examples only), RUN/D/data (tokenizer only) and RUN/D/data_all (all groups, for the
intra-cluster run). `python -m recipes.electra.prepare export --ckpt STEP_DIR --data DIR --out BASE` writes
config.json, model.pdparams and spm.model: ABNet loads BASE with `source_pretrained: BASE`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from nebula import smoke

__all__ = ["distribute", "export_base", "main"]


def distribute(corpus: Path, run: Path, generators: dict[str, str], discriminator: str) -> None:
    """Copy each cluster's part of `corpus` into RUN/<cluster>/data (and RUN/<disc>/data_all)."""
    from recipes.electra.data import META_FILE, TOKENIZER_FILE

    meta = json.loads((corpus / META_FILE).read_text())
    for cluster, group in generators.items():
        if group not in meta["groups"]:
            raise ValueError(f"cluster {cluster}: group {group!r} is not in the corpus ({sorted(meta['groups'])})")
        d = run / cluster / "data"
        d.mkdir(parents=True, exist_ok=True)
        for f in (META_FILE, TOKENIZER_FILE, f"group_{group}.npz"):
            shutil.copyfile(corpus / f, d / f)
    d = run / discriminator / "data"
    d.mkdir(parents=True, exist_ok=True)
    for f in (META_FILE, TOKENIZER_FILE):
        shutil.copyfile(corpus / f, d / f)
    all_dir = run / discriminator / "data_all"
    all_dir.mkdir(parents=True, exist_ok=True)
    for f in [META_FILE, TOKENIZER_FILE] + [f"group_{g}.npz" for g in meta["groups"]]:
        shutil.copyfile(corpus / f, all_dir / f)


def export_base(step_dir: Path, data_dir: Path, out: Path, preset_name: str) -> Path:
    """The discriminator of checkpoint `step_dir` as an ABNet base directory (config.json, model.pdparams,
    spm.model); a checkpoint of another preset is refused with the shapes that differ."""
    import paddle

    from recipes.text.base import write_base
    from recipes.electra.data import read_meta
    from recipes.electra.model import Discriminator, preset

    meta = read_meta(data_dir)
    cfg = preset(preset_name).discriminator.replace(vocab_size=int(meta["vocab_size"]), max_positions=meta["max_len"])
    f = step_dir / "disc" / "model.pdparams"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: point --ckpt at a step directory that holds the disc stage")
    state = paddle.load(str(f))
    want = Discriminator(cfg).state_dict()
    bad = [f"{k}: {list(state[k].shape)} vs {list(v.shape)}" for k, v in want.items()
           if k in state and list(state[k].shape) != list(v.shape)]
    if bad or any(k not in state for k in want):
        raise ValueError(f"{f} is not a {preset_name!r} discriminator ({'; '.join(bad[:3]) or 'parameters missing'});"
                         " pass the preset it was trained with (--preset)")
    body = {k[len("electra."):]: v for k, v in state.items() if k.startswith("electra.")}
    return write_base(out, body, cfg.to_dict(), data_dir / "spm.model")


def main(argv: list[str] | None = None) -> int:
    """Parse and run one subcommand."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="build the corpus and each cluster's data directory")
    d.add_argument("--out", required=True, help="run directory")
    d.add_argument("--groups", default="", help="name=lang,lang;name=lang (default: romance_germanic, slavic_cjk)")
    d.add_argument("--clusters", default="G1,G2", help="generator clusters, one per group in order")
    d.add_argument("--discriminator", default="D")
    d.add_argument("--max-per-language", type=int, default=0)
    d.add_argument("--vocab-size", type=int, default=2000)
    d.add_argument("--max-len", type=int, default=32)
    d.add_argument("--locale-dir", default="/usr/share/locale")
    d.add_argument("--abnet-test-per-mille", type=int, default=100,
                   help="largest --test-per-mille of the ABNet runs this base may serve: their dev/test sentences "
                        "stay out of training")
    e = sub.add_parser("export", help="discriminator checkpoint -> ABNet base directory")
    e.add_argument("--ckpt", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--preset", default="tiny")
    args = ap.parse_args(argv)
    if args.cmd == "data" and smoke.active():  # the smallest corpus (--max-per-language 0, every message, too)
        args.max_per_language = min(args.max_per_language or 400, 400)
        args.vocab_size = min(args.vocab_size, 1000)
    try:
        if args.cmd == "data":
            from recipes.electra.data import DEFAULT_GROUPS, CorpusConfig, parse_groups, prepare

            groups = parse_groups(args.groups) if args.groups else dict(DEFAULT_GROUPS)
            clusters = [c for c in args.clusters.split(",") if c]
            if len(clusters) != len(groups):
                raise ValueError(f"{len(groups)} language groups need {len(groups)} generator clusters, got "
                                 f"--clusters {args.clusters}")
            run = Path(args.out)
            cfg = CorpusConfig(groups=groups, max_per_language=args.max_per_language, vocab_size=args.vocab_size,
                               max_len=args.max_len, abnet_test_per_mille=args.abnet_test_per_mille)
            meta = prepare(run / "corpus", cfg, args.locale_dir)
            distribute(run / "corpus", run, dict(zip(clusters, groups)), args.discriminator)
            print(f"corpus: {meta['split_sizes']} messages (train/dev/test), vocabulary {meta['vocab_size']}, "
                  f"examples per group {meta['group_examples']}")
        else:
            out = export_base(Path(args.ckpt), Path(args.data), Path(args.out), args.preset)
            print(f"ABNet base written to {out} (source_pretrained: {out})")
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
