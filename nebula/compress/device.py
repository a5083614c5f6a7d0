"""Codecs on the tensor's own device: paddle ops encode and decode where the tensor lives; only compressed bytes cross to the host.

A paddle.Tensor given to any codec is compressed with paddle ops on its place (GPU/NPU/CPU): casts with
`paddle.cast`, INT8/INT4 absmax quantisation with paddle reductions, SVD and low-rank factors with
`paddle.linalg`. `encode_tensor_to_frames` then copies the payload leaves (the compressed bytes, never the input)
to the host for the wire, and `decode_frames_to_tensor` copies them onto the receiver's device and decodes there.
The frames are the same wire format as the numpy path's (same header, same payload layout), so a CPU-only peer
decodes them with numpy and the other way round. The runtime (`TensorCoder`) takes this path for tensors on an
accelerator only; `backend.codec_path` sends CPU tensors through numpy, which costs less there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from . import backend as B
from .base import Codec, CodecError, get_codec
from .frames import DEFAULT_MAX_BYTES, decode_from_frames, encoded_to_frames

__all__ = ["DeviceFrames", "encode_tensor_to_frames", "decode_frames_to_tensor", "relative_error_on_device"]


@dataclass(frozen=True, slots=True)
class DeviceFrames:
    """Wire frames of one tensor encoded on its device, with its byte accounting."""

    frames: list[Any]
    nbytes: int  # on the wire: header plus every payload
    host_copy_bytes: int  # copied from the device to the host: the payloads only
    raw_nbytes: int  # the input tensor's own size
    place: str  # where the codec ran

    @property
    def ratio(self) -> float:
        """Wire bytes over the raw tensor's bytes."""
        return self.nbytes / self.raw_nbytes if self.raw_nbytes else 1.0


def encode_tensor_to_frames(codec: Codec | str, x: Any) -> DeviceFrames:
    """Encode paddle.Tensor `x` with paddle ops on its own device and copy only the compressed payloads to the host.

    Pass a codec instance to keep a stateful codec's state (lowrank warm starts, ef residuals, auto decisions).
    """
    if not B.is_paddle(x):
        raise CodecError(f"encode_tensor_to_frames expects a paddle.Tensor, got {type(x).__name__}; numpy arrays "
                         "go through nebula.compress.encode_to_frames")
    enc = get_codec(codec).encode(x.detach() if not x.stop_gradient else x)
    host = [leaf for leaf in enc.leaves() if not B.is_paddle(leaf)]
    if host:  # every codec keeps paddle inputs in paddle; a host leaf would mean a silent device round trip
        raise CodecError(f"codec {enc.spec!r} produced {len(host)} host payload(s) for a paddle.Tensor; it does not "
                         "run on the device. Use a codec from nebula.compress.known_codecs()")
    frames = encoded_to_frames(enc)
    return DeviceFrames(frames, enc.nbytes, enc.payload_nbytes, B.nbytes_of(x), str(x.place))


def decode_frames_to_tensor(frames: Sequence[Any], place: Any = None, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Decode wire frames (from either path) into a paddle.Tensor on `place` (default: paddle's current device).

    Only the compressed payloads are copied to the device; decoding (casts, dequantisation, U S V^T) runs there.
    """
    return decode_from_frames(frames, like="paddle", place=place, max_bytes=max_bytes)


def relative_error_on_device(x: Any, y: Any) -> float:
    """||x - y|| / ||x|| of two paddle.Tensors, reduced on their device (two scalars reach the host)."""
    import paddle

    xd = paddle.cast(paddle.reshape(x, [-1]), "float64")
    yd = paddle.cast(paddle.reshape(y, [-1]), "float64")
    den = float(paddle.linalg.norm(xd))
    num = float(paddle.linalg.norm(xd - yd))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den
