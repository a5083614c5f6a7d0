"""Mask-predict decoding (Ghazvininejad et al., as in ABNet) over several length candidates."""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F

from .model import AbnetDecoder, source_keep_mask
from recipes.text.tokenizer import MASK_ID, NUM_SPECIAL, PAD_ID

__all__ = ["mask_predict"]


@paddle.no_grad()
def mask_predict(decoder: AbnetDecoder, h: paddle.Tensor, length_beam: int = 3, iterations: int = 4,
                 ) -> list[list[int]]:
    """Translate a batch from encoder output `h` [B, S, H]: best of `length_beam` lengths, `iterations` refinements.

    Iteration 0 predicts every position; iteration t re-masks the n = L*(T-t)/T least confident tokens and predicts
    them again. The candidate with the highest mean log-probability wins."""
    if length_beam < 1 or iterations < 1:
        raise ValueError(f"length_beam={length_beam}, iterations={iterations}: both must be >= 1")
    was_training = decoder.training
    decoder.eval()
    try:
        h = h.astype("float32")
        batch = h.shape[0]
        keep = source_keep_mask(h)
        len_logits = decoder.predict_length(h, keep).numpy()
        len_logits[:, 0] = -np.inf  # an empty translation is never the answer
        beam = min(length_beam, len_logits.shape[1] - 1)
        lengths = np.argsort(-len_logits, axis=1)[:, :beam]  # [B, beam]
        flat_len = lengths.reshape(-1)
        width = int(flat_len.max())
        real = np.arange(width)[None, :] < flat_len[:, None]  # [B*beam, W]
        tokens = np.where(real, MASK_ID, PAD_ID).astype(np.int64)
        probs = np.zeros(tokens.shape, dtype=np.float32)
        hx = paddle.repeat_interleave(h, beam, axis=0)
        for t in range(iterations):
            if t > 0:
                num = (flat_len * (iterations - t) // iterations).astype(np.int64)
                order = np.argsort(np.where(real, probs, np.inf), axis=1, kind="stable")
                rank = np.argsort(order, axis=1, kind="stable")
                remask = (rank < num[:, None]) & real
                tokens = np.where(remask, MASK_ID, tokens)
            else:
                remask = real
            logits, _ = decoder(hx, paddle.to_tensor(tokens))
            logp = np.log(np.maximum(F.softmax(logits, axis=-1).numpy(), 1e-30))  # log_softmax is slow on CPU
            logp[:, :, :NUM_SPECIAL] = -np.inf  # never emit pad/unk/mask/cls
            best = logp.argmax(-1)
            best_p = np.take_along_axis(logp, best[..., None], -1)[..., 0]
            tokens = np.where(remask, best, tokens)
            probs = np.where(remask, best_p, probs)
        score = np.where(real, probs, 0.0).sum(1) / np.maximum(flat_len, 1)
        pick = score.reshape(batch, beam).argmax(1)
        out = []
        for b in range(batch):
            row = b * beam + pick[b]
            out.append([int(x) for x in tokens[row, : flat_len[row]]])
        return out
    finally:
        if was_training:
            decoder.train()
