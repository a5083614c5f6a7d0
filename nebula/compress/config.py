"""CompressionConfig: the codec per direction and the step from which compression starts (embedded in the job config)."""
from __future__ import annotations

from dataclasses import dataclass

from .base import get_codec

__all__ = ["CompressionConfig"]

DIRECTIONS = ("forward", "backward")


@dataclass(frozen=True, kw_only=True, slots=True)
class CompressionConfig:
    """Codecs for activations sent forward and gradients sent back; before `start_step` both send 'none'.

    Defaults: forward 'none', backward 'none', start_step 0 (compress from the first step, as in Table 5).
    The paper's best setting is forward 'fp16(svd(0.6))', backward 'int8', start_step 2000 (Figure 10).
    """

    forward: str = "none"
    backward: str = "none"
    start_step: int = 0

    def __post_init__(self) -> None:
        for direction in DIRECTIONS:
            spec = getattr(self, direction)
            if not isinstance(spec, str):
                raise ValueError(f"compression.{direction} = {spec!r} must be a codec spec string such as 'fp16' "
                                 f"or 'fp16(svd(0.6))'")
            try:
                get_codec(spec)
            except ValueError as exc:
                raise ValueError(f"compression.{direction} = {spec!r} is not a valid codec spec: {exc}") from None
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"compression.start_step = {self.start_step!r} must be an integer >= 0 (0 compresses "
                             f"from the first step)")

    def spec_at(self, direction: str, step: int) -> str:
        """Codec spec to use for `direction` ('forward' or 'backward') at training step `step`."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction {direction!r} must be 'forward' or 'backward'")
        return "none" if step < self.start_step else getattr(self, direction)
