"""Array helpers that work on numpy arrays and on paddle.Tensors (on their own device) without importing paddle eagerly."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

__all__ = [
    "is_paddle", "kind_of", "dtype_name", "wire_dtype_name", "shape_of", "numel", "nbytes_of", "is_float_dtype", "contiguous",
    "compute_dtype", "cast", "reshape", "to_host", "from_host", "parallel_chunks", "FLOAT_DTYPES", "WIRE_DTYPES",
    "codec_path", "current_device",
]

FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
# Every dtype that may appear on the wire, with its item size in bytes.
WIRE_DTYPES = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8, "complex128": 16,
}
_CHUNK_MIN = 1 << 20  # below this many elements threading costs more than it saves
_POOL: ThreadPoolExecutor | None = None
_WORKERS = max(1, min(4, os.cpu_count() or 1))


def is_paddle(x: Any) -> bool:
    """True if x is a paddle.Tensor (checked by type name so paddle is imported only when used)."""
    t = type(x)
    return t.__module__.startswith("paddle") and t.__name__ in ("Tensor", "EagerParamBase", "Parameter")


def kind_of(x: Any) -> str:
    """'paddle' for a paddle.Tensor, 'numpy' for a numpy array."""
    return "paddle" if is_paddle(x) else "numpy"


def dtype_name(x: Any) -> str:
    """Plain dtype name ('float32', 'bfloat16', 'int64', ...) of a numpy array or paddle.Tensor."""
    if is_paddle(x):
        return str(x.dtype).rsplit(".", 1)[-1]
    return x.dtype.name


def wire_dtype_name(x: Any) -> str:
    """Dtype name a payload carries in the frame header: bfloat16 bits are 'uint16' on both paths (numpy has no
    bfloat16 and holds them as uint16), so paddle- and numpy-encoded headers are byte-identical."""
    name = dtype_name(x)
    return "uint16" if name == "bfloat16" else name


def is_float_dtype(name: str) -> bool:
    """True for the floating dtypes that lossy codecs compress."""
    return name in FLOAT_DTYPES


def shape_of(x: Any) -> tuple[int, ...]:
    """Shape as a tuple of ints."""
    return tuple(int(d) for d in x.shape)


def numel(x: Any) -> int:
    """Number of elements."""
    return int(np.prod(shape_of(x), dtype=np.int64))


def nbytes_of(x: Any) -> int:
    """Bytes the array occupies when serialised contiguously."""
    if is_paddle(x):
        return numel(x) * WIRE_DTYPES[dtype_name(x)]
    return int(x.nbytes)


def contiguous(x: Any) -> Any:
    """x itself if it is contiguous, else a contiguous copy (a strided view cannot go on the wire as is)."""
    if is_paddle(x):
        return x if x.is_contiguous() else x.contiguous()
    return x if x.flags.c_contiguous else x.copy(order="C")


def compute_dtype(name: str) -> str:
    """Dtype codecs compute in: float64 stays float64, every other float is handled as float32."""
    return "float64" if name == "float64" else "float32"


def cast(x: Any, name: str) -> Any:
    """Cast to dtype `name`, returning x itself when it already has it."""
    if dtype_name(x) == name:
        return x
    if is_paddle(x):
        import paddle

        return paddle.cast(x, name)
    return x.astype(name)


def reshape(x: Any, shape: tuple[int, ...]) -> Any:
    """Reshape without copying a contiguous input."""
    if is_paddle(x):
        import paddle

        return paddle.reshape(x, list(shape))
    return x.reshape(shape)


def to_host(x: Any) -> np.ndarray:
    """A contiguous numpy view (CPU paddle: zero-copy via DLPack) or host copy (GPU) of x, for the wire."""
    x = contiguous(x)
    if not is_paddle(x):
        return x
    if x.place.is_cpu_place() and dtype_name(x) not in ("bfloat16", "float16", "bool"):
        try:
            return np.from_dlpack(x)
        except (TypeError, RuntimeError, BufferError):
            pass
    return x.numpy()


def from_host(a: np.ndarray, dtype: str, kind: str, place: Any = None) -> Any:
    """Turn a host array that arrived from the wire into the requested kind (paddle: copied onto `place`)."""
    if kind == "numpy":
        return a
    import paddle

    if dtype == "bfloat16":
        a = a.view(np.uint16)  # paddle maps uint16 host arrays to bfloat16 tensors
    return paddle.to_tensor(a, place=place)


def codec_path(place: Any, dtype: str = "float32") -> str:
    """Where the runtime encodes or decodes a tensor of `dtype` that lives on `place`: 'paddle' (paddle ops on that
    device, only compressed bytes cross to the host) on an accelerator, 'numpy' on the CPU.

    On the CPU paddle's per-op overhead makes its codecs cost several times numpy's on boundary-sized tensors (and the
    host copy they avoid is free there: CPU tensors reach numpy zero-copy). bfloat16 stays on paddle everywhere,
    as numpy has no bfloat16. `place` is a paddle Place or a device name as paddle.get_device() gives it ('cpu',
    'gpu:0', 'npu:1').
    """
    name = str(place)
    if name.startswith("Place(") and name.endswith(")"):
        name = name[len("Place("):-1]
    on_cpu = name.split(":", 1)[0] in ("cpu", "gpu_pinned", "xpu_pinned")  # pinned memory is host memory
    return "numpy" if on_cpu and dtype != "bfloat16" else "paddle"


def current_device() -> str:
    """The device paddle puts new tensors on in this process ('cpu', 'gpu:0', ...)."""
    import paddle

    return paddle.get_device()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="compress")
    return _POOL


def parallel_chunks(fn: Callable[[int, int], Any], n: int, align: int = 1) -> None:
    """Call fn(start, stop) over [0, n) split into aligned chunks on a small thread pool (numpy releases the GIL)."""
    workers = _WORKERS
    if n < 2 * _CHUNK_MIN or workers == 1:
        fn(0, n)
        return
    step = -(-n // workers)
    step = -(-step // align) * align
    futures = [_pool().submit(fn, a, min(n, a + step)) for a in range(0, n, step)]
    for f in futures:
        f.result()
