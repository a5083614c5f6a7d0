"""Field types that several config files share, each validated once, where the file is loaded."""
from __future__ import annotations

from typing import Annotated

from nebula.compress import get_codec
from nebula.config.schema import Check

__all__ = ["CodecSpec"]

# a nebula.compress spec string (`int8`, `ef(topk(0.05))`, `fp16(svd(0.6))`): parsed and its codec built on load,
# so an unknown name or a bad argument is one line naming the key, before any process starts
CodecSpec = Annotated[str, Check(get_codec, "codec spec")]
