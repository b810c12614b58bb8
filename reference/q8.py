"""The q8 mirror: the reference's side of the opt-in "q8" activation mode
(docs/numerics.md#activation-modes). Its matrices are ``Q8Matrix``: ``w @ x``
quantizes x to int8 per block of 32 first, as the fast path's q8 mode does,
bit for bit (its f32 FMAs built exactly from f64 operations, ``fma_f32``).
weights.py makes them in place of the f32 matrices.
"""
from __future__ import annotations

import numpy as np

from gemma_cy.quant.affine import AffineTensor, Q4_KTensor
from gemma_cy.quant.ggml import Q4_1Tensor, Q5_0Tensor
from gemma_cy.quant.tensors import Q8_0_BLOCK, Int8Tensor, Q8_0Tensor, quantize_activations_q8


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """f32(a * b + c) rounded once, elementwise, for f32 arrays: C's fmaf,
    what one FMA instruction gives. NumPy has none, so: a * b is exact in
    f64 (24 + 24 bits); s = a * b + c rounded to f64 and its error e (Knuth's
    two-sum, exact); s rounded to odd (the f64 neighbour on the exact sum's
    side whose last bit is 1, when e != 0), which the cast to f32 then
    rounds as it would the exact sum, since f64 keeps more than 24 + 1 bits
    (docs/numerics.md#activation-modes)."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c = np.broadcast_to(c.astype(np.float64), p.shape)
        s = p + c
        bb = s - p
        e = (p - (s - bb)) + (c - bb)
        bits = s.view(np.uint64).copy()
        fix = (e != 0) & np.isfinite(e) & ((bits & 1) == 0)
        away = (e > 0) == (s > 0)  # the exact sum is further from zero than s
        bits[fix & away] += np.uint64(1)
        bits[fix & ~away] -= np.uint64(1)
        return bits.view(np.float64).astype(np.float32)


class Q8Matrix:
    """A weight matrix (rows, cols) for the q8 mode: ``w @ x`` quantizes x
    (cols,) to int8 per block of 32 (gemma_cy.quant.tensors.quantize_activations_q8)
    and returns (rows,) f32, bit for bit what the fast path computes:

        isum[r, b] = sum_i wq[r, b, i] * xq[b, i]     exact integers (< 2^20)
        s[r, b]    = xd[b]                  Int8Tensor (one weight scale w_s)
                   = f32(d[r, b] * xd[b])   Q8_0Tensor, Q5_0Tensor (block scales d)
        acc[r]     = fma_f32(f32(isum[r, b]), s[r, b], acc[r])   block after block, from 0
        out[r]     = acc[r]  [* w_s, one f32 product]

    all in f32, one rounding per block (the kernels' FMA; the order is the
    kernels' order, so the sums are the same numbers).
    """

    ROWS_PER_CHUNK = 8192  # bounds the f32 copy of the int8 values to ~20 MB at cols 640

    def __init__(self, tensor: Int8Tensor | Q8_0Tensor | Q5_0Tensor | AffineTensor | Q4_KTensor | Q4_1Tensor) -> None:
        rows, cols = tensor.shape
        if cols % Q8_0_BLOCK:
            raise ValueError(f"q8 activations need cols % {Q8_0_BLOCK} == 0, got a ({rows}, {cols}) matrix")
        self.shape = (rows, cols)
        self.affine = tensor.levels() if isinstance(tensor, (AffineTensor, Q4_KTensor, Q4_1Tensor)) else None
        if self.affine is not None:
            self.wq, self.wd, self.scale = None, None, None
        elif isinstance(tensor, (Q8_0Tensor, Q5_0Tensor)):  # a Q5_0Tensor's levels and d are its Q8_0 blocks'
            self.wq = tensor.qs  # (rows, nb, 32) int8
            self.wd = tensor.d.astype(np.float32).reshape(rows, -1)  # (rows, nb) f32
            self.scale = None
        else:
            self.wq = tensor.q.reshape(rows, -1, Q8_0_BLOCK)  # (rows, nb, 32) int8
            self.wd = None
            self.scale = np.float32(tensor.scale)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        xq, xd = quantize_activations_q8(x)  # (cols,) int8, (nb,) f32
        if self.affine is not None:
            return self._affine_matmul(xq, xd)
        xq = xq.reshape(-1, Q8_0_BLOCK).astype(np.float32)  # (nb, 32)
        out = np.empty(self.shape[0], dtype=np.float32)  # (rows,)
        for r in range(0, self.shape[0], self.ROWS_PER_CHUNK):
            wq = self.wq[r:r + self.ROWS_PER_CHUNK].astype(np.float32)  # (n, nb, 32)
            isum = np.einsum("rbk,bk->rb", wq, xq)  # (n, nb), exact integers (< 2^24: exact in f32)
            if self.scale is None:
                s = self.wd[r:r + len(wq)] * xd  # (n, nb): f32 products
            else:
                s = np.broadcast_to(xd, isum.shape)  # (n, nb)
            acc = np.zeros(len(wq), dtype=np.float32)  # (n,)
            for b in range(isum.shape[1]):  # block after block, as the kernels
                acc = fma_f32(isum[:, b], s[:, b], acc)
            out[r:r + len(wq)] = acc if self.scale is None else acc * self.scale
        return out

    def _affine_matmul(self, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
        """An AffineTensor (or a Q4_KTensor or Q4_1Tensor, read as its records) times quantized activations,
        record after record, in f32:
        acc = fma_f32(f32(isum), f32(a * d), acc), then acc = fma_f32(-f32(qsum), f32(b * d), acc),
        with isum = sum q * xq and qsum = sum xq over the record's values and d
        the activations' block scale (kernels/common.pxi, k_dot_affine_q8)."""
        lv, sub = self.affine, self.affine.sub
        rows, cols = self.shape
        n_sub = cols // sub
        xs = xq.reshape(n_sub, sub).astype(np.int64)  # (n_sub, sub)
        d = np.repeat(xd, Q8_0_BLOCK // sub)  # (n_sub,) the block scale of each record
        acc = np.zeros(rows, dtype=np.float32)  # (rows,)
        for s in range(n_sub):  # record after record, as the kernels
            q = lv.q[:, s * sub:(s + 1) * sub].astype(np.int64)  # (rows, sub)
            isum = (q @ xs[s]).astype(np.float32)  # (rows,) exact integers
            acc = fma_f32(isum, lv.a[:, s] * d[s], acc)
            if lv.b is not None:
                acc = fma_f32(np.float32(-xs[s].sum()), lv.b[:, s] * d[s], acc)
        return acc
