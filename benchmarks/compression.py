"""Benchmark nebula.compress on a transformer layer's real activation and gradient: bytes, error, speed, Table 5, targets.

Tensors: a paddle TransformerEncoderLayer of ABNet's adapter width (d_model 512) over real text (UTF-8 bytes of the
gettext catalogs on this machine), batch x seq x 512 output `h` and the gradient of a next-byte loss w.r.t. `h`,
taken over a few training steps so warm-started codecs see the drift a real run has.

    .venv/bin/python benchmarks/compression.py [--batch 128 --seq 64 --hidden 512 --steps 3]

numpy's BLAS runs single-threaded here (OPENBLAS_NUM_THREADS=1 unless set): on a shared CPU its spinning worker
threads turn a 0.5 s SVD into 5-12 s and a 5 ms sketch into 300 ms, which would measure the neighbours, not the codecs.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads its BLAS

import argparse
import gettext
import glob
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from nebula.compress import decode_encoded, get_codec, relative_error
from nebula.compress import factorize as F

RATES_MBIT = (60, 100, 170)
PAPER_R = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
# Nebula-I Table 5: forward / backward compression ratio, training speed (s/step), BLEU
PAPER_TABLE5 = [("baseline", "none", "none", 1.00, 1.00, 4.42, 43.19), ("FP16+INT8", "fp16", "int8", 0.50, 0.25, 1.60, 38.82)] + [
    (f"FP16(SVD({r}))+INT8", f"fp16(svd({r}))", "int8", fwd, 0.25, speed, bleu) for r, fwd, speed, bleu in [
        (0.9, 0.45, 2.10, 39.71), (0.8, 0.40, 1.50, 41.15), (0.7, 0.34, 1.56, 40.74), (0.6, 0.30, 1.42, 41.92),
        (0.5, 0.25, 1.24, 39.45), (0.4, 0.20, 0.94, 39.56), (0.3, 0.15, 0.90, 37.48), (0.2, 0.09, 0.86, 39.00)]]
SMALL_RANKS = (1, 2, 5, 10)  # up to 2% of the smaller dimension (512)
WARM_SPECS = {f"lowrank(rank={k})" for k in SMALL_RANKS} | {"fp16(lowrank(energy=0.9))", "auto(0.01, mbit=60)"}


@dataclass
class Row:
    spec: str
    nbytes: int
    error: float
    encode_s: float
    decode_s: float


def real_text_bytes(limit: int) -> np.ndarray:
    """UTF-8 bytes of the English message ids in the gettext catalogs (real text, no download)."""
    out = bytearray()
    for path in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo")):
        try:
            with open(path, "rb") as f:
                cat = gettext.GNUTranslations(f)._catalog  # noqa: SLF001 - the catalog is the data we want
        except (OSError, UnicodeDecodeError, gettext.error if hasattr(gettext, "error") else OSError):
            continue
        except Exception:  # some catalogs have odd headers; they are simply skipped
            continue
        for k in cat:
            if isinstance(k, str) and k:
                out += k.encode("utf-8", "ignore") + b"\n"
        if len(out) >= limit:
            break
    if len(out) < limit:
        out = (out or bytearray(b"no catalogs found ")) * (limit // max(1, len(out)) + 1)
    return np.frombuffer(bytes(out[:limit]), np.uint8)


def layer_tensors(batch: int, seq: int, hidden: int, steps: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(activation, gradient) pairs from `steps` SGD steps of embedding -> TransformerEncoderLayer -> byte head."""
    import paddle
    import paddle.nn as nn
    import paddle.nn.functional as fn

    paddle.seed(seed)
    text = real_text_bytes(batch * (seq + 1) * steps)
    emb = nn.Embedding(256, hidden)
    layer = nn.TransformerEncoderLayer(hidden, nhead=8, dim_feedforward=4 * hidden, dropout=0.1, activation="gelu")
    head = nn.Linear(hidden, 256)
    pos = np.arange(seq)[:, None] / np.power(10000.0, np.arange(0, hidden, 2)[None, :] / hidden)
    pe = np.zeros((seq, hidden), np.float32)
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos), np.cos(pos)
    pe = paddle.to_tensor(pe)
    params = emb.parameters() + layer.parameters() + head.parameters()
    opt = paddle.optimizer.Adam(learning_rate=1e-3, parameters=params)
    out = []
    for step in range(steps):
        chunk = text[step * batch * (seq + 1):(step + 1) * batch * (seq + 1)].reshape(batch, seq + 1).astype(np.int64)
        ids, target = paddle.to_tensor(chunk[:, :-1]), paddle.to_tensor(chunk[:, 1:])
        h = layer(emb(ids) * math.sqrt(hidden) + pe)
        h.retain_grads()
        loss = fn.cross_entropy(head(h).reshape([-1, 256]), target.reshape([-1]))
        loss.backward()
        out.append((h.numpy().copy(), h.grad.numpy().copy()))
        opt.step()
        opt.clear_grad()
    return out


def timed(fn: Callable[[], Any], budget_s: float = 0.4, max_reps: int = 7, min_reps: int = 3) -> tuple[float, Any]:
    """Least wall time of fn over a few repetitions (the machine is shared: the minimum is the stable statistic)."""
    times, result = [], None
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def measure(spec: str, x: np.ndarray, history: list[np.ndarray] = ()) -> Row:
    """Encode/decode times and error of `spec` on x; warm-started codecs first see the earlier steps' tensors."""
    codec = get_codec(spec)
    if spec in WARM_SPECS:
        for prev in history:  # the warm start comes from the previous steps, as in training
            codec.encode(prev)
    t0 = time.perf_counter()
    enc = codec.encode(x)  # the error is this first encoding's: warm from the previous step, not from x itself
    enc_s = time.perf_counter() - t0
    if not ("svd" in spec or "ratio" in spec or "0.99" in spec):  # full SVDs take seconds: one run is enough
        enc_s = min(enc_s, timed(lambda: codec.encode(x))[0])
    dec_s, y = timed(lambda: decode_encoded(enc))
    return Row(spec, enc.nbytes, relative_error(x, y), enc_s, dec_s)


def transfer_s(nbytes: int, mbit: float) -> float:
    return nbytes * 8 / (mbit * 1e6)


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n### {title}\n")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


def codec_table(name: str, x: np.ndarray, rows: list[Row]) -> None:
    base = x.size * 4
    out = []
    for r in rows:
        larger = " (larger than FP32!)" if r.nbytes > base * 1.001 else ""
        out.append([r.spec, f"{r.nbytes / base:.4f}{larger}", f"{r.error:.4f}", f"{r.encode_s * 1e3:.1f}",
                    f"{r.decode_s * 1e3:.1f}", *(f"{transfer_s(r.nbytes, m):.3f}" for m in RATES_MBIT)])
    print_table(f"{name} {list(x.shape)} float32 ({base / 2**20:.1f} MiB)",
                ["codec", "bytes/FP32", "rel. L2 err", "encode ms", "decode ms",
                 *(f"xfer s @{m} Mbit/s" for m in RATES_MBIT)], out)


def codec_specs() -> list[str]:
    paper = ["none", "fp16", "int8"] + [f"fp16(svd({r}))" for r in PAPER_R]
    better = ["bf16", "int8_row", "int8_block(64)", "int4_block(64)", "int4_block(32)", "fp4(block=64)",
              "huffman(int4_block(64))", "huffman(int3_block(64))", "huffman(fp4(block=64))"]
    better += [f"lowrank(rank={k})" for k in SMALL_RANKS]
    better += [f"int8_row(lowrank(ratio={x}))" for x in (0.1, 0.6, 1.0)]
    better += ["int4_block(lowrank(ratio=0.6), 32)"]
    better += ["fp16(lowrank(energy=0.9))", "fp16(lowrank(energy=0.999999))", "int8_row(lowrank(energy=0.99))",
               "topk(0.01)", "fp16(topk(0.1))", "auto(0.01, mbit=60)"]
    return paper + better


def throughput_table(pair: tuple[np.ndarray, np.ndarray]) -> bool:
    """FP16/INT8 (and other quantizers, and the Huffman stage over 3- and 4-bit codes) encode+decode speed: wall
    clock, and CPU time of all threads."""
    rows, ok_all = [], True
    for spec in ("fp16", "int8", "bf16", "int8_row", "int8_block(64)", "int4_block(64)", "fp4(block=64)",
                 "huffman(int4_block(64))", "huffman(int3_block(64))", "huffman(fp4(block=64))"):
        for which, x in zip(("activation", "gradient"), pair):
            codec = get_codec(spec)
            enc_s, enc = timed(lambda: codec.encode(x), budget_s=1.0, max_reps=15, min_reps=5)
            dec_s, _ = timed(lambda: decode_encoded(enc), budget_s=1.0, max_reps=15, min_reps=5)
            c0 = time.process_time()
            for _ in range(5):
                decode_encoded(codec.encode(x))
            cpu_s = (time.process_time() - c0) / 5
            gbps = x.nbytes / (enc_s + dec_s) / 1e9
            target = spec in ("fp16", "int8")
            if target:
                ok_all &= gbps >= 1.0
            rows.append([spec, which, f"{enc_s * 1e3:.1f}", f"{dec_s * 1e3:.1f}", f"{gbps:.2f}",
                         f"{x.nbytes / cpu_s / 1e9:.2f}", ("PASS" if gbps >= 1.0 else "FAIL") if target else "(info)"])
    print_table(f"Target: FP16 and INT8 encode+decode >= 1 GB/s of FP32 input on this CPU (load average "
                f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)",
                ["codec", "tensor", "encode ms", "decode ms", "GB/s (wall)", "GB/s per CPU-second", "result"], rows)
    return ok_all


def svd_shape_table(shapes: dict[str, tuple[int, int]]) -> None:
    out = []
    for name, (m, n) in shapes.items():
        full = min(m, n)
        # svd(r) sends k(m+n+1) values against m*n: larger once k > m*n/(m+n+1)
        r_star = m * n / (m + n + 1) / full
        bad = [r for r in PAPER_R if F.keep_count(r, m, n) * (m + n + 1) > m * n]
        out.append([name, f"[{m}, {n}]", f"{min(1.0, r_star):.3f}" if r_star < 1 else "never",
                    ", ".join(map(str, bad)) or "none"])
    print_table("Where SVD is larger than the tensor it compresses (same element type)",
                ["shape", "matrix", "svd(r) larger for r >", "paper r affected"], out)


DEMO_SPECS = ["none", "fp16", "bf16", "int8", "int8_row", "int8_block(64)", "int4_block(64)", "fp16(svd(0.9))",
              "fp16(svd(0.6))", "fp16(svd(0.4))", "fp16(svd(0.3))", "fp16(svd(0.2))", "int8(svd(0.3))",
              "fp16(lowrank(rank=8))", "int8_row(lowrank(rank=16))"]
DEMO_SEQS = (4, 8, 12, 16)  # the demo's max_len is 16; batches are padded to their longest sentence


def demo_shapes_table(seed: int) -> None:
    """Forward ratio (wire bytes / float32 bytes) and error of each candidate at [8, T, 64] (2 ranks x 2 micro-batches
    of the demo's global batch 32, hidden 64), on a TransformerEncoderLayer's activations over real text."""
    import logging

    logging.getLogger("nebula.compress").setLevel(logging.ERROR)  # inflation warnings: the table says it
    from nebula import smoke

    seqs = smoke.pick(DEMO_SEQS, DEMO_SEQS[::3])  # (NEBULA_SMOKE: the shortest and the longest)
    acts = {t: layer_tensors(8, t, 64, 2, seed)[-1][0] for t in seqs}
    rows = []
    for spec in DEMO_SPECS:
        ratios, errors = [], []
        for t, x in acts.items():
            enc = get_codec(spec).encode(x)
            ratios.append(enc.nbytes / x.nbytes)
            errors.append(relative_error(x, decode_encoded(enc)))
        rows.append([spec, *(f"{r:.3f}" for r in ratios), f"{max(ratios):.3f}", f"{max(errors):.4f}",
                     "yes" if max(ratios) < 0.5 else "no"])
    print_table("Forward ratio at the ABNet demo's micro-batch shapes [8, T, 64] (wire bytes incl. header / float32)",
                ["codec", *(f"T={t}" for t in seqs), "worst ratio", "worst rel. L2 err", "below fp16's 0.50"],
                rows)


# The key rows' codecs of Table 5 (benchmarks/abnet_table5.py): forward and backward specs.
PATH_SPECS = ["fp16", "int8", "fp16(svd(0.6))", "fp16(svd(0.2))", "int4_block(64)", "ef(int8(lowrank(rank=4)))"]


def cpu_paths_table(seed: int, reps: int = 15) -> None:
    """Encode + decode time of a CPU paddle.Tensor at the demo's boundary shape [8, 16, 64] on the two paths:
    paddle ops (nebula.compress.device, what an accelerator uses) and the runtime's TensorCoder (numpy for CPU
    tensors, by codec_path). Both paths alternate in one loop, so load changes hit both alike; medians of `reps`
    of this thread's CPU time (wall time on a shared machine mostly measures the neighbours)."""
    import logging
    import statistics

    import paddle

    from nebula.compress import TensorCoder, decode_frames_to_tensor, encode_tensor_to_frames

    logging.getLogger("nebula.compress").setLevel(logging.ERROR)
    x = paddle.to_tensor(layer_tensors(8, 16, 64, 2, seed)[-1][0])
    rows = []
    for spec in PATH_SPECS:
        dev_codec, coder = get_codec(spec), TensorCoder()
        times: dict[str, list[float]] = {"paddle": [], "runtime": []}
        for _ in range(reps):
            t0 = time.thread_time()
            decode_frames_to_tensor(encode_tensor_to_frames(dev_codec, x).frames)
            times["paddle"].append(time.thread_time() - t0)
            t0 = time.thread_time()
            coder.decode(coder.encode(x, spec), like="paddle")
            times["runtime"].append(time.thread_time() - t0)
        p, r = statistics.median(times["paddle"]), statistics.median(times["runtime"])
        rows.append([spec, f"{p * 1e3:.2f}", f"{r * 1e3:.2f}", f"{p / r:.1f}x"])
    print_table(f"CPU paddle.Tensor [8, 16, 64], encode + decode CPU ms (median of {reps}, paths alternating; "
                f"load average {os.getloadavg()[0]:.1f})",
                ["codec", "paddle ops (device path)", "runtime (codec_path: numpy on CPU)", "paddle / runtime"], rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128, help="sequences per batch (paper: 128)")
    ap.add_argument("--seq", type=int, default=64, help="sequence length (paper: 64)")
    ap.add_argument("--hidden", type=int, default=512, help="model width (ABNet adapter: 512)")
    ap.add_argument("--steps", type=int, default=3, help="training steps; the last one is measured")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--throughput-only", action="store_true", help="only the FP16/INT8 speed table (fast)")
    ap.add_argument("--demo-shapes", action="store_true",
                    help="only the forward ratio of candidate codecs at the ABNet demo's micro-batch shapes [8, T, 64]")
    ap.add_argument("--cpu-paths", action="store_true",
                    help="only the codec time of CPU tensors at [8, 16, 64]: paddle ops vs the runtime's numpy path")
    args = ap.parse_args()
    if args.cpu_paths:
        from nebula import smoke

        cpu_paths_table(args.seed, reps=smoke.pick(15, 3))  # (NEBULA_SMOKE: every codec, fewer timings)
        return 0
    if args.demo_shapes:
        demo_shapes_table(args.seed)
        return 0

    t0 = time.perf_counter()
    steps = layer_tensors(args.batch, args.seq, args.hidden, max(2, args.steps), args.seed)
    print(f"tensors from {len(steps)} steps of a TransformerEncoderLayer(d_model={args.hidden}) on real text "
          f"in {time.perf_counter() - t0:.1f} s; OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    if args.throughput_only:
        return 0 if throughput_table(steps[-1]) else 1
    m, n = args.batch * args.seq, args.hidden
    results: dict[str, dict[str, Row]] = {}
    for which, idx in (("activation h (forward)", 0), ("gradient dL/dh (backward)", 1)):
        x = steps[-1][idx]
        history = [s[idx] for s in steps[:-1]]
        rows = [measure(spec, x, history) for spec in codec_specs()]
        results[which] = {r.spec: r for r in rows}
        codec_table(which, x, rows)

    act, grad = results["activation h (forward)"], results["gradient dL/dh (backward)"]
    base = m * n * 4
    t5 = []
    for name, fwd, bwd, p_fwd, p_bwd, p_speed, p_bleu in PAPER_TABLE5:
        f, b = act[fwd], grad[bwd]
        work = f.encode_s + f.decode_s + b.encode_s + b.decode_s
        comm60 = transfer_s(f.nbytes + b.nbytes, 60)
        t5.append([name, f"{p_fwd:.2f}", f"{f.nbytes / base:.3f}", f"{p_bwd:.2f}", f"{b.nbytes / base:.3f}",
                   f"{f.error:.4f}", f"{b.error:.4f}", f"{work * 1e3:.0f}", f"{comm60:.3f}", f"{work + comm60:.3f}",
                   f"{p_speed:.2f}", f"{p_bleu:.2f}"])
    print_table("Nebula-I Table 5 rows reproduced on this tensor pair (ours: measured; paper: as printed)",
                ["row", "paper fwd ratio", "fwd bytes/FP32", "paper bwd ratio", "bwd bytes/FP32", "fwd err",
                 "bwd err", "enc+dec ms", "xfer s @60", "enc+dec+xfer s", "paper s/step", "paper BLEU"], t5)

    svd_shape_table({"this run (B*T, H)": (m, n), "ABNet paper batch (128*64, 768)": (128 * 64, 768),
                     "one sequence (64, 768)": (64, 768), "small batch (8*64, 512)": (8 * 64, 512),
                     "micro-batch (16*64, 512)": (16 * 64, 512)})

    ok_all = True
    # Target 1: lowrank vs full SVD at small ranks, warm-started across steps.
    x = steps[-1][0]
    a = x.reshape(m, n)
    rows = []
    for k in SMALL_RANKS:
        svd_s, (u, s, vt) = timed(lambda: F.truncated_svd(a, k), budget_s=0.0, min_reps=2)
        svd_err = relative_error(a, (u * s) @ vt)
        low = measure(f"lowrank(rank={k})", x, [st[0] for st in steps[:-1]])
        speedup = svd_s / low.encode_s
        saved = transfer_s(base - low.nbytes, 60)
        ok = speedup >= 30 and low.error <= 1.02 * svd_err and low.encode_s <= 0.05 * saved
        ok_all &= ok
        rows.append([str(k), f"{svd_s * 1e3:.0f}", f"{low.encode_s * 1e3:.1f}", f"{speedup:.0f}x", f"{svd_err:.4f}",
                     f"{low.error:.4f}", f"{low.error / svd_err:.4f}", f"{100 * low.encode_s / saved:.2f}%",
                     "PASS" if ok else "FAIL"])
    print_table("Target: lowrank >= 30x faster than full SVD at the same rank, <= 2% more error, encode <= 5% of "
                "the transfer time saved at 60 Mbit/s (activation, warm start across steps)",
                ["rank", "full SVD ms", "lowrank ms", "speedup", "SVD err", "lowrank err", "err ratio",
                 "encode / saved@60", "result"], rows)

    # Target 2: the frontier of the best codecs beats fp16(svd(r)) for every paper r.
    for which, res in results.items():
        rows = []
        for r in PAPER_R:
            ref = res[f"fp16(svd({r}))"]
            better = [c for c in res.values() if c.nbytes <= ref.nbytes and c.error < ref.error
                      and not c.spec.startswith(("fp16(svd", "auto"))]
            best = min(better, key=lambda c: c.error, default=None)
            ok = best is not None
            if which.startswith("activation"):  # the paper used fp16(svd(r)) on activations only
                ok_all &= ok
            rows.append([f"fp16(svd({r}))", f"{ref.nbytes / base:.4f}", f"{ref.error:.4f}",
                         best.spec if best else "-", f"{best.nbytes / base:.4f}" if best else "-",
                         f"{best.error:.4f}" if best else "-",
                         ("PASS" if ok else "FAIL") if which.startswith("activation") else ("yes" if ok else "no")])
        print_table(f"Target: a codec with no more bytes and strictly less error than each paper setting ({which})",
                    ["paper codec", "bytes/FP32", "err", "best codec within those bytes", "bytes/FP32", "err",
                     "result"], rows)

    # Target 3: FP16 and INT8 encode+decode throughput on this CPU.
    ok_all &= throughput_table(steps[-1])

    # The paddle.Tensor path (CPU in this run): the same codecs with paddle ops, no host copies while encoding.
    import paddle

    rows = []
    xt = paddle.to_tensor(steps[-1][0])
    for spec in ("fp16", "bf16", "int8", "int8_block(64)", "int4_block(64)", "lowrank(rank=10)", "fp16(svd(0.6))"):
        codec = get_codec(spec)
        enc_s, enc = timed(lambda: codec.encode(xt))
        dec_s, y = timed(lambda: decode_encoded(enc))
        rows.append([spec, f"{enc_s * 1e3:.1f}", f"{dec_s * 1e3:.1f}", f"{base / (enc_s + dec_s) / 1e9:.2f}",
                     f"{relative_error(xt, y):.4f}", str(y.place)])
    print_table("paddle.Tensor inputs (activation; decoded on the input's device)",
                ["codec", "encode ms", "decode ms", "GB/s", "rel. L2 err", "decoded on"], rows)

    # auto: what it picks as the link bandwidth changes.
    rows = []
    for budget in (0.001, 0.01, 0.05):
        for which, idx in (("activation", 0), ("gradient", 1)):
            codec = get_codec(f"auto({budget}, mbit=60)")
            xx = steps[-1][idx]
            for mbit in (60, 100, 170, 10_000):
                codec.update_bandwidth(mbit * 1e6 / 8)
                enc = codec.encode(xx)
                rows.append([str(budget), which, str(mbit), codec.chosen(xx.shape), f"{enc.nbytes / base:.4f}",
                             f"{relative_error(xx, decode_encoded(enc)):.4f}"])
    print_table("auto(budget): choice per link bandwidth (re-decided on update_bandwidth)",
                ["budget", "tensor", "Mbit/s", "chosen", "bytes/FP32", "err"], rows)
    print(f"\nall targets: {'PASS' if ok_all else 'FAIL'}  (total {time.perf_counter() - t0:.0f} s)")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
