"""A checkpoint writer to be killed: imports Paddle once, then for every line `run ROUND` on stdin forks a child that
saves checkpoints without end (printing its pid, then `saved` after every save); `quit` ends it. Each child saves
steps 1, 2, ..., STEPS over and over (pruning to the newest 3), so the steps on disk are saved again and again with
other contents: pass P of round R is generation G = R * 100 + P % 100, and every weight of step S, generation G is
S * 100000 + G.

Usage: python _ckpt_writer.py pipeline|hybrid ROOT"""
from __future__ import annotations

import os
import sys

import itertools

WIDTH, LAYERS, CLUSTER, STEPS = 256, 4, "A", 6


def value(step: int, gen: int) -> float:
    return float(step * 100000 + gen)


def make_model(kind: str):
    """The layers and their optimizers (one per stage for the pipeline's checkpoints, one for all layers for the
    hybrid's), after one step (so they have state to save)."""
    import paddle

    layers = [paddle.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
    groups = [[layer] for layer in layers] if kind == "pipeline" else [layers]
    opts = [paddle.optimizer.Momentum(parameters=[p for layer in g for p in layer.parameters()]) for g in groups]
    x = paddle.ones([2, WIDTH])
    for layer in layers:
        x = layer(x)
    x.mean().backward()
    for opt in opts:
        opt.step()
        opt.clear_grad()
    return layers, opts


def _fill(layers, v: float) -> None:
    import paddle

    for layer in layers:
        for p in layer.parameters():
            p.set_value(paddle.full(p.shape, v, dtype=p.dtype))


def _write_forever(kind: str, root: str, round_: int) -> None:
    import numpy as np
    import paddle

    from nebula.hybrid import checkpoint as hck
    from nebula.pipeline import checkpoint as pck

    layers, opts = make_model(kind)
    names = [f"s{i}" for i in range(LAYERS)]
    for i in itertools.count():
        step, gen = 1 + i % STEPS, round_ * 100 + (i // STEPS) % 100
        _fill(layers, value(step, gen))
        if kind == "pipeline":
            pck.save(root, step, CLUSTER, dict(zip(names, zip(layers, opts))), {"gen": gen},
                     extra={"v": np.full(64, value(step, gen))})
            pck.prune(root, CLUSTER, names, 3)
        else:
            hck.save_layers(root, step, 0, layers, opts[0])
            hck.commit(root, step, CLUSTER, {"gen": gen, "num_layers": LAYERS})
            pck.prune(root, CLUSTER, hck.layer_parts(LAYERS), 3)
        # one write: print() writes the text and its newline apart when stdout is unbuffered (PYTHONUNBUFFERED), and
        # a kill between the two left "saved" without its newline, joined to the parent's next line
        sys.stdout.write("saved\n")
        sys.stdout.flush()


def main(kind: str, root: str) -> None:
    import paddle  # noqa: F401  (once, before forking)

    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[:1] == ["quit"]:
            return
        pid = os.fork()
        if pid == 0:
            try:
                _write_forever(kind, root, int(cmd[1]))
            finally:
                os._exit(1)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        print("reaped", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
