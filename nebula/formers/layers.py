"""A PaddleFormers causal LM as Nebula's layered model: embeddings, each decoder layer, final norm, head.

Layer i is a fresh copy of the checkpoint's module (the loaded model is read once per process and never trained in
place), so every stage, rank, probe and layout starts from the checkpoint's weights. A decoder layer computes what
the library's model computes around it: positions 0..S-1, their rotary embeddings and the causal mask, from the
hidden states it receives; so only hidden states cross a cut. Sequences are right-padded: a causal mask keeps real
tokens from seeing the padding after them, and the loss ignores padded positions. A checkpoint with tied input and
output embeddings gets an untied head that starts from the embedding weights (the two ends of the model may live
in different clusters).
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

from nebula.formers.checkpoint import CheckpointInfo
from nebula.formers.loading import kernel_choice, load_causal_lm
from nebula.hybrid.layered import LayeredModel

__all__ = ["CausalLMLayers", "IGNORE_INDEX", "causal_lm_loss", "layer_names"]

IGNORE_INDEX = -100  # label of a padded position


def causal_lm_loss(logits: Any, labels: Any) -> Any:
    """Mean next-token cross-entropy over the positions whose label is not IGNORE_INDEX."""
    import paddle.nn.functional as F

    v = logits.shape[-1]
    target = labels[:, 1:].reshape([-1])
    per_token = F.cross_entropy(logits[:, :-1, :].reshape([-1, v]).astype("float32"), target,
                                ignore_index=IGNORE_INDEX, reduction="none")
    # paddle's reduction="mean" divides by every position, padded ones included: average over the real ones
    real = (target != IGNORE_INDEX).astype("float32")
    return per_token.reshape([-1]).sum() / real.sum().clip(min=1.0)


def layer_names(num_hidden_layers: int) -> list[str]:
    """Names of the layers in order: embed, decoder0.., norm, head."""
    return ["embed", *(f"decoder{i}" for i in range(num_hidden_layers)), "norm", "head"]


def _layer_classes() -> tuple[type, type, type]:
    import paddle

    class Embed(paddle.nn.Layer):
        """Token ids [B, S] -> hidden states [B, S, H]."""

        def __init__(self, embed_tokens: Any) -> None:
            super().__init__()
            self.embed_tokens = embed_tokens

        def forward(self, ids: Any) -> Any:
            return self.embed_tokens(ids).astype(self.embed_tokens.weight.dtype)

    class Decoder(paddle.nn.Layer):
        """One decoder layer with the positions, rotary embeddings and causal mask of a whole sequence."""

        def __init__(self, layer: Any, rotary: Any, config: Any, prepare_mask: Any) -> None:
            super().__init__()
            self.layer, self.rotary = layer, rotary
            self._config, self._prepare_mask = config, prepare_mask

        def forward(self, h: Any) -> Any:
            from paddleformers.transformers.masking_utils import create_causal_mask_and_row_indices

            b, s = int(h.shape[0]), int(h.shape[1])
            pos = paddle.arange(s, dtype="int64").unsqueeze(0).tile([b, 1])
            mask, rows = create_causal_mask_and_row_indices(
                config=self._config, inputs_embeds=h, batch_size=b, seq_length=s, cache_length=0,
                prepare_decoder_attention_mask=self._prepare_mask)
            out = self.layer(h, attention_mask=mask, attn_mask_startend_row_indices=rows, position_ids=pos,
                             position_embeddings=self.rotary(h, pos))
            return out[0] if isinstance(out, (tuple, list)) else out

    class Wrapped(paddle.nn.Layer):
        """One library module applied to the hidden states (the final norm, the head), under its own name."""

        def __init__(self, name: str, module: Any) -> None:
            super().__init__()
            self._name = name
            self.add_sublayer(name, module)

        def forward(self, h: Any) -> Any:
            return getattr(self, self._name)(h)

    return Embed, Decoder, Wrapped


class CausalLMLayers(LayeredModel):
    """The causal LM of a checkpoint directory as `num_hidden_layers + 3` layers, with its data and loss.

    `data` gives token ids and labels per example id (`nebula.formers.data.TokenData`); `kernels` is auto, plain,
    checkpoint or a mapping device -> one of them (`nebula.formers.loading.kernel_choice`), read on first use, after
    the runtime has set the device; `optimizer` is adamw or sgd (both per parameter, so any cut trains like the
    whole model). The checkpoint is read when the first layer is built.
    """

    def __init__(self, info: CheckpointInfo, data: Any, *, kernels: Any = "auto", lr: float = 1e-3,
                 optimizer: str = "adamw", weight_decay: float = 0.0) -> None:
        if optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer={optimizer!r} must be 'adamw' or 'sgd'")
        kernel_choice(kernels, "cpu")  # a bad value fails here, not on the first build
        self.info, self.data, self.kernels = info, data, kernels
        self.lr, self.optimizer, self.weight_decay = lr, optimizer, weight_decay
        self._model: Any = None
        self.num_hidden_layers = info.num_hidden_layers
        self.num_layers = self.num_hidden_layers + 3
        self.num_examples = data.num_examples

    def _lm(self) -> Any:
        if self._model is None:
            import paddle

            self._model = load_causal_lm(self.info.path, kernel_choice(self.kernels, paddle.device.get_device()))
        return self._model

    @property
    def config(self) -> Any:
        """The library config the layers were built with."""
        return self._lm().config

    def names(self) -> list[str]:
        """Layer names in order."""
        return layer_names(self.num_hidden_layers)

    def build_layer(self, index: int) -> Any:
        """A fresh copy of layer `index` with the checkpoint's weights."""
        embed_cls, decoder_cls, wrapped_cls = _layer_classes()
        lm = self._lm()
        base = lm.model
        if index == 0:
            return embed_cls(copy.deepcopy(base.embed_tokens))
        if index <= self.num_hidden_layers:
            return decoder_cls(copy.deepcopy(base.layers[index - 1]), copy.deepcopy(base.rotary_emb), lm.config,
                               type(base)._prepare_decoder_attention_mask)
        if index == self.num_hidden_layers + 1:
            return wrapped_cls("norm", copy.deepcopy(base.norm))
        if index == self.num_layers - 1:
            return wrapped_cls("lm_head", copy.deepcopy(lm.lm_head))
        raise IndexError(f"layer {index} out of range 0..{self.num_layers - 1}")

    def inputs(self, ids: np.ndarray) -> Any:
        """Token ids [len(ids), seq_len] of examples `ids`."""
        import paddle

        return paddle.to_tensor(self.data.tokens(ids))

    def targets(self, ids: np.ndarray) -> Any:
        """Labels: the tokens, IGNORE_INDEX on padding."""
        import paddle

        return paddle.to_tensor(self.data.labels(ids))

    def loss(self, output: Any, targets: Any) -> Any:
        """Causal-LM loss of the logits."""
        return causal_lm_loss(output, targets)

    def build_optimizer(self, parameters: list) -> Any:
        """AdamW or SGD over `parameters`."""
        import paddle

        if self.optimizer == "sgd":
            return paddle.optimizer.SGD(learning_rate=self.lr, parameters=parameters)
        return paddle.optimizer.AdamW(learning_rate=self.lr, parameters=parameters, weight_decay=self.weight_decay)
