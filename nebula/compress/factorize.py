"""Pure low-rank math on numpy arrays and paddle.Tensors: truncated SVD and randomized range finding with power iteration."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import backend as B

__all__ = ["matrix_shape", "keep_count", "truncated_svd", "randomized_svd", "energy_rank", "squared_norm",
           "reconstruct"]


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The 2-D view a tensor is factorised as: [B, T, H] -> [B*T, H] (paper §2.3); 1-D -> [1, n]; 0-D -> [1, 1]."""
    n = shape[-1] if shape else 1
    m = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    return m, n


def keep_count(ratio: float, m: int, n: int) -> int:
    """Number of singular values kept for ratio r: round(r * min(m, n)), at least 1."""
    full = min(m, n)
    return max(1, min(full, int(round(ratio * full))))


def _svd(a: Any) -> tuple[Any, Any, Any]:
    if B.is_paddle(a):
        import paddle

        return paddle.linalg.svd(a, full_matrices=False)
    return np.linalg.svd(a, full_matrices=False)


def _qr(a: Any) -> Any:
    if B.is_paddle(a):
        import paddle

        return paddle.linalg.qr(a, mode="reduced")[0]
    return np.linalg.qr(a, mode="reduced")[0]


def _mm(a: Any, b: Any, transpose_a: bool = False) -> Any:
    if B.is_paddle(a):
        import paddle

        return paddle.matmul(a, b, transpose_x=transpose_a)
    return (a.T if transpose_a else a) @ b


def truncated_svd(a: Any, k: int) -> tuple[Any, Any, Any]:
    """Full (LAPACK) SVD of matrix a, keeping the k largest singular values: (u [m,k], s [k], vt [k,n])."""
    u, s, vt = _svd(a)
    return B.contiguous(u[:, :k]), B.contiguous(s[:k]), B.contiguous(vt[:k])


def randomized_svd(a: Any, width: int, power: int, omega: Any) -> tuple[Any, Any, Any]:
    """Approximate SVD of a from the range of a @ omega ([n, width] start block), refined by `power` iterations.

    Halko, Martinsson & Tropp (2011), Alg. 4.4 with QR re-orthonormalisation; returns (u, s, vt) of rank `width`,
    and vt.T is a good start block for the next, similar matrix (warm start).
    """
    q = _qr(_mm(a, omega))
    for _ in range(power):
        q = _qr(_mm(a, _qr(_mm(a, q, transpose_a=True))))
    small = _mm(q, a, transpose_a=True)  # [width, n]
    ub, s, vt = _svd(small)
    return _mm(q, ub), s, vt


def squared_norm(a: Any) -> float:
    """Squared Frobenius norm (total energy), accumulated in float64."""
    if B.is_paddle(a):
        import paddle

        return float(paddle.sum(paddle.square(paddle.cast(a, "float64"))))
    flat = a.reshape(-1)
    # float32 dot products over short runs, summed in float64: accurate without a float64 copy of `a`
    return float(sum(float(np.dot(flat[i:i + 65536], flat[i:i + 65536])) for i in range(0, flat.size, 65536)))


def energy_rank(s: Any, total: float, energy: float) -> int | None:
    """Smallest k whose top-k singular values hold `energy` of `total`, or None if all of s holds less."""
    s2 = np.square(np.asarray(s.numpy() if B.is_paddle(s) else s, dtype=np.float64))
    csum = np.cumsum(s2)
    target = energy * total
    if csum.size == 0 or csum[-1] < target * (1 - 1e-9):
        return None
    return int(min(csum.size, np.searchsorted(csum, target * (1 - 1e-9)) + 1))


def reconstruct(p: Any, q: Any) -> Any:
    """p @ q."""
    return _mm(p, q)
