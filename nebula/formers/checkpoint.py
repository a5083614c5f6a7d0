"""Local checkpoint directories of library models: where they are, which family they hold, and the hub refusal.

Nebula reads models from disk only: `from_pretrained` names a directory holding `config.json`, the weights
(safetensors, as the library's `save_pretrained` writes them) and the tokenizer files. Anything else, a hub name
such as ``meta-llama/Llama-2-7b-hf`` in particular, is refused with one line before the library is asked (which
would otherwise try the network, retry for half a minute and fail with a long traceback).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FormersError", "CheckpointInfo", "resolve_pretrained", "require_formers", "FORMERS_INSTALL"]

FORMERS_INSTALL = "pip install -e '.[formers]'"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name, as the model hubs spell repositories


class FormersError(ValueError):
    """A library model cannot be used as configured; the message names the path or key and the fix."""


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A local checkpoint directory and what its config.json says."""

    path: Path
    model_type: str
    config: dict[str, Any]

    @property
    def num_hidden_layers(self) -> int:
        """Decoder layers of the model."""
        return int(self.config["num_hidden_layers"])


def require_formers() -> Any:
    """The `paddleformers.transformers` module, or FormersError saying how to install the extra."""
    try:
        import paddleformers.transformers as pft
    except ImportError as exc:
        raise FormersError(f"library models need PaddleFormers, which is not installed ({exc}); install the extra: "
                           f"{FORMERS_INSTALL}") from None
    return pft


def resolve_pretrained(path: str | Path, *, key: str = "from_pretrained") -> CheckpointInfo:
    """The checkpoint directory `path` (relative to the current directory), checked; FormersError otherwise.

    A hub name gets one line saying to download it elsewhere and point `key` at the directory.
    """
    p = Path(path).expanduser()
    text = str(path)
    if not p.exists():
        if _HUB_NAME.match(text) and not text.startswith((".", "/")):
            raise FormersError(f"{key}: {text!r} looks like a model hub name, and Nebula loads local checkpoints only "
                               f"(no network): download it on a machine with access (e.g. `huggingface-cli download "
                               f"{text} --local-dir DIR`) and set {key} to that directory")
        raise FormersError(f"{key}: {text!r} is not a directory (looked in {p.resolve()}); point it at a checkpoint "
                           "directory written by save_pretrained (config.json, *.safetensors, tokenizer files)")
    if not p.is_dir():
        raise FormersError(f"{key}: {text!r} is a file; point it at the checkpoint directory that holds it")
    cfg_file = p / "config.json"
    try:
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormersError(f"{key}: {p} has no config.json; it is not a checkpoint written by save_pretrained") \
            from None
    except (OSError, ValueError) as exc:
        raise FormersError(f"{key}: {cfg_file} cannot be read as JSON ({exc}); rewrite it with save_pretrained") \
            from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise FormersError(f"{key}: {cfg_file} names no model_type; rewrite it with the library's save_pretrained")
    if not isinstance(config.get("num_hidden_layers"), int) or config["num_hidden_layers"] < 1:
        raise FormersError(f"{key}: {cfg_file}: num_hidden_layers={config.get('num_hidden_layers')!r} must be an "
                           "integer >= 1")
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.pdparams")):
        raise FormersError(f"{key}: {p} holds no weights (*.safetensors); save the model there with save_pretrained")
    return CheckpointInfo(p.resolve(), config["model_type"], config)
