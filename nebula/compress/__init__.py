"""Communication compression between clusters: codecs named by spec strings, exact byte accounting, wire frames.

Spec grammar: ``name`` or ``name(arg, key=value, ...)``; an element codec may take another codec as its inner
argument, and then compresses that codec's float parts (``fp16(svd(0.6))`` = the paper's FP16 over SVD(0.6)).
Relative errors below are ||x - decoded|| / ||x||.

Lossless
  none                      identity; raw bytes of any dtype.
Paper codecs (Nebula-I §2.3, Table 5)
  fp16[(inner)]             IEEE half: 2 bytes/element; error <= 2^-11 relative per element; max |x| 65504.
  int8[(inner)]             8-bit integers with one absmax scale per tensor: |error| <= max|x|/254.
  svd(r)                    full SVD of the [B*T, H] matrix (leading dims flattened), keep round(r*min(m,n)) >= 1
                            singular values, send U, S, V^T (k(m+n+1) values); r in (0, 1]; svd(1.0) is exact to
                            float precision. Larger than the tensor when k(m+n+1) > m*n (e.g. square matrices, r > ~0.5).
Better codecs
  bf16[(inner)]             bfloat16 (round to nearest even): 2 bytes/element, FP32 range, 2^-8 relative.
  int8_row[(inner)]         INT8 with one FP32 scale per row of the last dimension.
  int8_block[(inner,] [block=64])   INT8 with one FP32 scale per `block` consecutive elements.
  int4_block[(inner,] [block=64])   4-bit (levels -7..7) per block, two per byte: |error| <= max|block|/14.
  int3_block[(inner,] [block=64])   levels -3..3 per block, a code per byte: |error| <= max|block|/6; meant
                            inside huffman: about 2 bits a code on Laplace-like data (deltas).
  lowrank(rank=K | ratio=R | energy=E, power=0, oversample=8, warm=1, seed=0)
                            rank-k factors P=U*S [m,k], Q=V^T [k,n] by randomized range finding (sketch width
                            k+oversample) with `power` extra iterations; the start block is the previous call's right
                            singular vectors (warm start, state per instance), so each call is one subspace
                            iteration carried across steps as in PowerSGD; a cold start does one iteration more.
                            energy=E keeps the fewest singular values holding E of ||x||^2.
                            Falls back to the exact SVD when the sketch would cover half the smaller dimension.
  topk(f)                   the round(f*n) largest |x| as int32 indices + values; f in (0, 1].
  fp4[(inner,] [block=32])  FP4 E2M1 (±{0, .5, 1, 1.5, 2, 3, 4, 6}) times a bf16 scale max|block|/6 per block, two
                            codes per byte (0.5625 bytes/element at block 32): |error| <= max(max|block|/23.9, |x|/5).
  topk2(f)                  top-k with 2-bit values (SparseLoCo): round(f*n) largest |x|, Elias-Fano indices
                            (~2 + log2(1/f) bits each), sign + magnitude-bucket bit, two scales; use ef(topk2(f)).
  int2_block[(inner,] [block=64])   2-bit codes (±0.5, ±1.5 of max|block|/1.5) per block: |error| <= max|block|/3,
                            0.3125 bytes/element; meant for deltas.
  delta(inner, first=int8_block, cache_mb=64)
                            activation deltas (AQ-SGD), keyed and two-sided: encode_keyed(x, ids) sends row i of
                            sample ids[i] as inner(x - m) against the cached m both ends hold, or first(x) when
                            absent; each end keeps a cache of cache_mb MiB (LRU) updated with what the receiver
                            decodes; the receiver decodes with its own instance; a desync is refused (DesyncError).
  huffman(inner)            lossless: the inner encoding's integer codes Huffman-coded (zlib deflate, Huffman only),
                            a part that would not shrink sent as it was; outermost (inside ef at most), e.g.
                            ef(huffman(fp4(block=64))); int4 codes shrink 12-28%, FP4's 1-14% (normal to heavy-tailed data).
  ef(inner)                 error feedback: sends inner(x + e), keeps e = (x + e) - decoded per tensor shape, so the
                            sum of decoded tensors tracks the sum of inputs (use for lossy gradient codecs).
  auto(budget[, cand, ...], mbit=100, every=500)
                            measures every candidate (default: casts, int8/int4 variants, fp16/int8 lowrank at the
                            matching energy) on the first tensor of a shape and every `every` tensors, then sends with
                            the one minimising encode + bytes/bandwidth + decode among those within `budget` relative
                            error; update_bandwidth(bytes_per_s) re-decides.

Rules for every codec: integer, bool, complex and empty tensors pass through losslessly; NaN/Inf input to a lossy
codec raises NonFiniteError; unknown names raise SpecError listing the known ones; float16/bfloat16 inputs are
computed in float32, float64 in float64, and decode returns the input's kind, shape and dtype (numpy has no
bfloat16: a bfloat16 tensor decoded as numpy comes back as float32). Stateful codecs (ef, lowrank, auto) keep state
per instance: use one instance per channel and direction. Decoding needs no state: every node of an Encoded names
the codec that decodes it. Wire format: ``encode_to_frames`` gives a header frame (magic NBC1, JSON codec tree,
dtypes, shapes) and one zero-copy frame per payload; ``Encoded.nbytes`` is exactly the sum of the frame lengths.

On the device: a paddle.Tensor is encoded and decoded with paddle ops where it lives (casts, absmax quantisation,
``paddle.linalg`` SVD/QR); ``encode_tensor_to_frames`` copies only the compressed payloads to the host and
``decode_frames_to_tensor`` decodes onto a device. Both paths write the same header and payload layout, so either
decodes the other's frames. ``TensorCoder`` (channels, pipeline boundaries) picks the path by the tensor's place
(``codec_path``): paddle ops on an accelerator, numpy for a CPU tensor, where paddle's per-op overhead costs more.
A codec whose encoding at some shape is larger than the raw tensor (``svd(r)`` of a nearly square matrix), or a
nested codec larger than its outer codec alone (``fp16(svd(0.6))`` vs ``fp16``), logs one warning per shape on the
``nebula.compress`` logger naming a smaller alternative; ``auto`` never picks such a candidate.
"""
from . import cast, delta, entropy, feedback, integer, lowbit, lowrank, sparse  # noqa: F401  (register codecs)
from .auto import AutoCodec, Measurement
from .backend import codec_path
from .base import (Codec, CodecError, Encoded, NonFiniteError, SpecError, decode_encoded, get_codec, known_codecs,
                   relative_error)
from .device import DeviceFrames, decode_frames_to_tensor, encode_tensor_to_frames
from .feedback import ErrorFeedbackCodec
from .frames import (FrameError, TensorCoder, decode_from_frames, encode_to_frames, encoded_to_frames,
                     frames_to_encoded)
from .lowrank import LowRankCodec, SVDCodec
from .spec import parse_spec

__all__ = [
    "Codec", "Encoded", "CodecError", "NonFiniteError", "SpecError", "FrameError", "get_codec", "known_codecs",
    "decode_encoded", "relative_error", "encode_to_frames", "encoded_to_frames", "frames_to_encoded",
    "decode_from_frames",
    "TensorCoder", "codec_path", "AutoCodec", "Measurement", "ErrorFeedbackCodec", "LowRankCodec",
    "SVDCodec", "parse_spec", "DeviceFrames", "encode_tensor_to_frames", "decode_frames_to_tensor",
]
