# The Python face of a simd_<isa> module's kernels: checked def wrappers in
# front of the k_* kernels of common.pxi, dot_<isa>.pxi and q8_*.pxi (the
# scikit-learn two-tier idiom). Each validates dtype, shape, contiguity and
# aliasing (TypeError / ValueError), releases the GIL and calls one kernel;
# gemma_cy.fast.ops re-exports them under the names of reference/ops.py.
# The validation helpers (_array, _out) serve forward.pxi's def entry points
# too.
#
# Included by every gemma_cy/fast/simd_<isa>.pyx after the kernels (the
# wrappers call the ISA's own k_dot_i8, k_quantize_q8...) and before
# forward.pxi.

import numpy as np


# ---------------------------------------------------------------------------
# Validation shared by the def wrappers


cdef object _array(object a, str what, object dtype, tuple ndims):
    """a itself when it is a C-contiguous ndarray of ``dtype`` with one of
    ``ndims`` dimensions; else TypeError (type, dtype) or ValueError."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{what} must have dtype {np.dtype(dtype)}, got {a.dtype}")
    if a.ndim not in ndims:
        raise ValueError(f"{what} must have {' or '.join(map(str, ndims))} dimensions, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    if not a.flags.aligned:
        raise ValueError(f"{what} is not aligned to its {a.dtype.itemsize}-byte items")
    return a


cdef object _out(object out, tuple shape, tuple inputs):
    """The f32 output array: a new one when ``out`` is None, else ``out``
    checked (shape, writable, and sharing no memory with an input unless it
    is that very array object: the kernels allow exact in-place)."""
    if out is None:
        return np.empty(shape, np.float32)
    _array(out, "out", np.float32, (len(shape),))
    if out.shape != shape:
        raise ValueError(f"out must have shape {shape}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out is read-only")
    for a in inputs:
        if out is not a and np.may_share_memory(out, a):
            raise ValueError("out shares memory with an input without being that array")
    return out


cdef void _same_length(str what, object a, object b) except *:
    if a.shape != b.shape:
        raise ValueError(f"{what}: shapes differ, {a.shape} and {b.shape}")


# ---------------------------------------------------------------------------
# Python API (what gemma_cy.fast.ops re-exports; names follow reference/ops.py)


def dot_i8(q, x, scale) -> float:
    """(sum_i q[i] * x[i]) * scale: int8 q (n,) times f32 x (n,), the scale
    applied once after the sum (docs/formats.md#int8-per-tensor-quantization). Any start address of q."""
    _array(q, "q", np.int8, (1,))
    _array(x, "x", np.float32, (1,))
    _same_length("dot_i8", q, x)
    cdef const int8_t[::1] qv = q
    cdef const float[::1] xv = x
    cdef float s = scale, result = 0
    cdef Py_ssize_t n = qv.shape[0]
    if n:
        with nogil:
            result = k_dot_i8(&qv[0], &xv[0], n, s)
    return result


def dot_f32(a, b) -> float:
    """sum_i a[i] * b[i] in f32: a, b (n,) f32; the bits of one attention
    score (scores(a[None], b[None])[0, 0])."""
    _array(a, "a", np.float32, (1,))
    _array(b, "b", np.float32, (1,))
    _same_length("dot_f32", a, b)
    cdef const float[::1] av = a, bv = b
    cdef float result = 0
    cdef Py_ssize_t n = av.shape[0]
    if n:
        with nogil:
            result = k_dot_f32(&av[0], &bv[0], n)
    return result


def axpy(a, x, y, out=None):
    """y + a * x (the weighted sum of v): x, y (n,) f32, a a scalar; out=y
    accumulates in place. Returns out."""
    _array(x, "x", np.float32, (1,))
    _array(y, "y", np.float32, (1,))
    _same_length("axpy", x, y)
    out = _out(out, y.shape, (x, y))
    if out is x:
        raise ValueError("axpy: out is x (it accumulates into y)")
    if out is not y:
        out[...] = y
    cdef float[::1] ov = out
    cdef const float[::1] xv = x
    cdef float s = a
    cdef Py_ssize_t n = ov.shape[0]
    if n:
        with nogil:
            k_axpy(&ov[0], s, &xv[0], n)
    return out


def scores(q, keys):
    """Attention scores q . keys^T: q (m, n), keys (n_keys, n) f32 -> (m,
    n_keys), each score in k_scores' one order (the same bits whether
    computed alone or with other rows and keys)."""
    _array(q, "q", np.float32, (2,))
    _array(keys, "keys", np.float32, (2,))
    if q.shape[1] != keys.shape[1]:
        raise ValueError(f"scores: q has {q.shape[1]} columns, keys {keys.shape[1]}")
    out = np.zeros((q.shape[0], keys.shape[0]), np.float32)
    cdef const float[:, ::1] qv = q
    cdef const float[:, ::1] kv = keys
    cdef float[:, ::1] ov = out
    cdef Py_ssize_t m = qv.shape[0], n_keys = kv.shape[0], n = qv.shape[1]
    if m and n_keys and n:  # (n == 0: every score is 0)
        with nogil:
            k_scores(&ov[0, 0], n_keys, &qv[0, 0], n, m, &kv[0, 0], n, n_keys, n)
    return out


def weighted_rows(w, x, y, out=None):
    """y + w . x: w (m, n_x), x (n_x, n), y (m, n) f32, each value summed in
    the order of x's rows as repeated axpy (the attention output of the query
    heads of one kv head: probabilities times values); out=y accumulates in
    place. Returns out."""
    _array(w, "w", np.float32, (2,))
    _array(x, "x", np.float32, (2,))
    _array(y, "y", np.float32, (2,))
    if w.shape[1] != x.shape[0] or y.shape != (w.shape[0], x.shape[1]):
        raise ValueError(f"weighted_rows: shapes w {w.shape}, x {x.shape}, y {y.shape} do not fit")
    out = _out(out, y.shape, (w, x, y))
    if out is w or out is x:
        raise ValueError("weighted_rows: out is w or x (it accumulates into y)")
    if out is not y:
        out[...] = y
    cdef const float[:, ::1] wv = w, xv = x
    cdef float[:, ::1] ov = out
    cdef Py_ssize_t m = wv.shape[0], n_x = wv.shape[1], n = xv.shape[1]
    if m and n_x and n:
        with nogil:
            k_weighted_rows(&ov[0, 0], n, &wv[0, 0], n_x, m, &xv[0, 0], n, n_x, n)
    return out


def softcap(x, cap, out=None):
    """cap * tanh(x / cap) (Gemma 2's soft-cap): x (n,) f32, cap > 0; out=x
    works in place. Returns out."""
    _array(x, "x", np.float32, (1,))
    if not cap > 0:
        raise ValueError(f"softcap: cap = {cap!r}, must be > 0")
    out = _out(out, x.shape, (x,))
    if out is not x:
        out[...] = x
    cdef float[::1] ov = out
    cdef float c = cap
    cdef Py_ssize_t n = ov.shape[0]
    if n:
        with nogil:
            k_softcap(&ov[0], n, c)
    return out


def gemv_i8(q, scale, x, out=None, resident=False):
    """out[r] = scale * sum_c q[r, c] * x[c] for int8 q (rows, cols), C-contiguous
    (read-only mapped views are fine), f32 x (cols,); returns out (rows,) f32.
    ``resident``: the kernel for a matrix in cache (k_gemv_i8_resident: the
    same values, maybe several rows at a time)."""
    _array(q, "q", np.int8, (2,))
    _array(x, "x", np.float32, (1,))
    if x.shape[0] != q.shape[1]:
        raise ValueError(f"gemv_i8: x has {x.shape[0]} values, q has {q.shape[1]} columns")
    out = _out(out, (q.shape[0],), (q,))
    if np.may_share_memory(out, x):  # every row reads all of x
        raise ValueError("gemv_i8: out shares memory with x")
    cdef const int8_t[:, ::1] qv = q
    cdef const float[::1] xv = x
    cdef float[::1] ov = out
    cdef float s = scale
    cdef Py_ssize_t rows = qv.shape[0], cols = qv.shape[1]
    cdef bint in_cache = resident
    if rows and cols:
        with nogil:
            if in_cache:
                k_gemv_i8_resident(&ov[0], &qv[0, 0], s, &xv[0], rows, cols)
            else:
                k_gemv_i8(&ov[0], &qv[0, 0], s, &xv[0], rows, cols)
    elif rows:
        out[:] = 0
    return out


def rmsnorm(x, gain, eps, one_plus, out=None):
    """x / sqrt(mean(x^2) + eps) * g (or * (1 + g) when one_plus), over the last
    axis: x (n,) or (rows, n) f32, gain (n,) f32; returns out (x's shape)."""
    _array(x, "x", np.float32, (1, 2))
    _array(gain, "gain", np.float32, (1,))
    width = x.shape[x.ndim - 1]
    if gain.shape[0] != width:
        raise ValueError(f"rmsnorm: gain has {gain.shape[0]} values, x rows have {width}")
    out = _out(out, x.shape, (x, gain))
    if x.size == 0:
        return out
    cdef const float[:, ::1] xv = x.reshape(-1, width)
    cdef const float[::1] gv = gain
    cdef float[:, ::1] ov = out.reshape(-1, width)
    cdef double e = eps
    cdef bint plus = one_plus
    cdef Py_ssize_t r, n = xv.shape[1]
    if n:
        with nogil:
            for r in range(xv.shape[0]):
                k_rmsnorm(&ov[r, 0], &xv[r, 0], &gv[0], n, e, plus)
    return out


def rope_cos_sin(pos, head_dim, base, factors=None, scale=1.0):
    """(cos, sin), each (head_dim/2,) f32, of the angles pos * base^(-2j/head_dim)
    [/ factors[j]], [times scale,] computed in f64 and rounded once (as
    gemma_cy_reference.ops.rope_cos_sin)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_cos_sin: head_dim = {head_dim}, must be even and > 0")
    cos_t = np.empty(head_dim // 2, np.float32)
    sin_t = np.empty(head_dim // 2, np.float32)
    cdef float[::1] cv = cos_t, sv = sin_t
    cdef const float[::1] fv
    cdef const float* f = NULL
    if factors is not None:
        factors = np.ascontiguousarray(factors, np.float32)
        if factors.shape != (head_dim // 2,):
            raise ValueError(f"rope_cos_sin: factors of shape {factors.shape}, expected ({head_dim // 2},)")
        fv = factors
        f = &fv[0]
    cdef Py_ssize_t hd = head_dim, p = pos
    cdef double b = base, sc = scale
    with nogil:
        k_rope_cos_sin(&cv[0], &sv[0], hd, p, b, f, sc)
    return cos_t, sin_t


_PAIRINGS = {"interleaved": ROPE_INTERLEAVED, "half_split": ROPE_HALF_SPLIT}


def rope(x, pos, base, pairing, out=None, rot_dims=0):
    """Each head of x (n_heads, head_dim) f32 with its pairs (a, b) rotated to
    (a cos - b sin, a sin + b cos) by pos * base^(-2j/head_dim); pairing
    "interleaved" (2j, 2j+1) or "half_split" (j, j + head_dim/2); rot_dims > 0:
    only the first rot_dims values of each head, as a head of that width. out=x
    rotates in place. Returns out."""
    _array(x, "x", np.float32, (2,))
    if pairing not in _PAIRINGS:
        raise ValueError(f"rope: pairing = {pairing!r}, expected one of {tuple(_PAIRINGS)}")
    cdef Py_ssize_t rot = rot_dims or x.shape[1]
    if rot % 2 or not 0 < rot <= x.shape[1]:
        raise ValueError(f"rope: rot_dims = {rot_dims}, must be even and in [0, {x.shape[1]}]")
    cos_t, sin_t = rope_cos_sin(pos, rot, base)
    out = _out(out, x.shape, (x,))
    if out is not x:
        out[...] = x
    cdef float[:, ::1] ov = out
    cdef const float[::1] cv = cos_t, sv = sin_t
    cdef RopePairing kind = _PAIRINGS[pairing]
    if ov.shape[0]:
        with nogil:
            k_rope_apply(&ov[0, 0], &cv[0], &sv[0], ov.shape[0], ov.shape[1], rot, kind)
    return out


def softmax(x, out=None):
    """Stable softmax over the last axis: exp(x - max) / sum; x (n,) or
    (rows, n) f32. out=x works in place. Returns out."""
    _array(x, "x", np.float32, (1, 2))
    out = _out(out, x.shape, (x,))
    if x.size == 0:
        return out
    if out is not x:
        out[...] = x
    cdef float[:, ::1] ov = out.reshape(-1, x.shape[x.ndim - 1])
    cdef Py_ssize_t r, n = ov.shape[1]
    if n:
        with nogil:
            for r in range(ov.shape[0]):
                k_softmax(&ov[r, 0], n)
    return out


def silu_mul(gate, up, out=None):
    """silu(gate) * up, silu(g) = g / (1 + exp(-g)): gate, up (n,) f32 -> out (n,)."""
    return _gated(gate, up, out, False)


def gelu_tanh_mul(gate, up, out=None):
    """gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))):
    gate, up (n,) f32 -> out (n,)."""
    return _gated(gate, up, out, True)


cdef object _gated(object gate, object up, object out, bint gelu):
    _array(gate, "gate", np.float32, (1,))
    _array(up, "up", np.float32, (1,))
    _same_length("gating", gate, up)
    out = _out(out, gate.shape, (gate, up))
    cdef const float[::1] gv = gate, uv = up
    cdef float[::1] ov = out
    cdef Py_ssize_t n = gv.shape[0]
    if n:
        with nogil:
            if gelu:
                k_gelu_tanh_mul(&ov[0], &gv[0], &uv[0], n)
            else:
                k_silu_mul(&ov[0], &gv[0], &uv[0], n)
    return out


def add(x, y, out=None):
    """x + y (the residual add): x, y (n,) f32; out=x adds in place. Returns out."""
    _array(x, "x", np.float32, (1,))
    _array(y, "y", np.float32, (1,))
    _same_length("add", x, y)
    out = _out(out, x.shape, (x, y))
    if out is y:  # f32 addition commutes: out = y + x
        x, y = y, x
    elif out is not x:
        out[...] = x
    cdef float[::1] ov = out
    cdef const float[::1] yv = y
    cdef Py_ssize_t n = ov.shape[0]
    if n:
        with nogil:
            k_add(&ov[0], &yv[0], n)
    return out


def dequantize_i8(q, scale, out=None):
    """q * scale as f32 (n,) from int8 q (n,) (one embedding row): each value
    one f32 product, bit-exact with q.astype(np.float32) * np.float32(scale)."""
    _array(q, "q", np.int8, (1,))
    out = _out(out, q.shape, (q,))
    cdef const int8_t[::1] qv = q
    cdef float[::1] ov = out
    cdef float s = scale
    cdef Py_ssize_t n = qv.shape[0]
    if n:
        with nogil:
            k_dequantize_i8(&ov[0], &qv[0], s, n)
    return out


cdef object _q8_0_blocks(object blocks, str what, int ndim):
    """blocks itself when it is a C-contiguous uint8 array (..., n_blocks, 34)
    with ``ndim`` dimensions; else TypeError or ValueError."""
    _array(blocks, what, np.uint8, (ndim,))
    if blocks.shape[ndim - 1] != Q8_0_BYTES:
        raise ValueError(f"{what} must have {Q8_0_BYTES}-byte Q8_0 blocks on its last axis, "
                         f"got shape {blocks.shape}")
    return blocks


def dot_q8_0(blocks, x) -> float:
    """sum_b f32(d_b) * (sum_i q_b[i] * x[32 b + i]): one row of Q8_0 blocks,
    uint8 (n_blocks, 34) (f16 d then 32 int8 each, any start address), times
    f32 x (32 * n_blocks,). Each block's sum is scaled by its d (docs/numerics.md#tolerances:
    the same value as the dequantized row . x, in another order)."""
    _q8_0_blocks(blocks, "blocks", 2)
    _array(x, "x", np.float32, (1,))
    if x.shape[0] != blocks.shape[0] * Q8_0_BLOCK:
        raise ValueError(f"dot_q8_0: x has {x.shape[0]} values, the blocks hold {blocks.shape[0] * Q8_0_BLOCK}")
    cdef const uint8_t[:, ::1] bv = blocks
    cdef const float[::1] xv = x
    cdef float result = 0
    cdef Py_ssize_t nb = bv.shape[0]
    if nb:
        with nogil:
            result = k_dot_q8_0(&bv[0, 0], &xv[0], nb)
    return result


def gemv_q8_0(blocks, x, out=None):
    """out[r] = dot_q8_0(blocks[r], x) for a Q8_0 matrix uint8 (rows, n_blocks,
    34), C-contiguous (read-only mapped views are fine), f32 x (32 * n_blocks,);
    returns out (rows,) f32."""
    _q8_0_blocks(blocks, "blocks", 3)
    _array(x, "x", np.float32, (1,))
    if x.shape[0] != blocks.shape[1] * Q8_0_BLOCK:
        raise ValueError(f"gemv_q8_0: x has {x.shape[0]} values, the rows hold {blocks.shape[1] * Q8_0_BLOCK}")
    out = _out(out, (blocks.shape[0],), (blocks,))
    if np.may_share_memory(out, x):  # every row reads all of x
        raise ValueError("gemv_q8_0: out shares memory with x")
    cdef const uint8_t[:, :, ::1] bv = blocks
    cdef const float[::1] xv = x
    cdef float[::1] ov = out
    cdef Py_ssize_t rows = bv.shape[0], nb = bv.shape[1]
    if rows and nb:
        with nogil:
            k_gemv_q8_0(&ov[0], &bv[0, 0, 0], &xv[0], rows, nb)
    elif rows:
        out[:] = 0
    return out


def dequantize_q8_0(blocks, out=None):
    """f32(d) * q as f32 (32 * n_blocks,) from one row of Q8_0 blocks uint8
    (n_blocks, 34): bit-exact with gemma_cy.quant.dequantize_q8_0."""
    _q8_0_blocks(blocks, "blocks", 2)
    out = _out(out, (blocks.shape[0] * Q8_0_BLOCK,), (blocks,))
    cdef const uint8_t[:, ::1] bv = blocks
    cdef float[::1] ov = out
    cdef Py_ssize_t nb = bv.shape[0]
    if nb:
        with nogil:
            k_dequantize_q8_0(&ov[0], &bv[0, 0], nb)
    return out


def quantize_q8(x):
    """Quantize f32 x (32 * n_blocks,) per block of 32 (k_quantize_q8, the
    q8 mode): returns (q int8 (32 * n_blocks,), d f32 (n_blocks,)), bit-exact
    with gemma_cy.quant.quantize_activations_q8."""
    _array(x, "x", np.float32, (1,))
    if x.shape[0] % Q8_0_BLOCK:
        raise ValueError(f"quantize_q8: x has {x.shape[0]} values, not a multiple of {Q8_0_BLOCK}")
    q = np.empty(x.shape[0], np.int8)
    d = np.empty(x.shape[0] // Q8_0_BLOCK, np.float32)
    cdef const float[::1] xv = x
    cdef int8_t[::1] qv = q
    cdef float[::1] dv = d
    cdef Py_ssize_t nb = dv.shape[0]
    if nb:
        with nogil:
            k_quantize_q8(&qv[0], &dv[0], &xv[0], nb)
    return q, d
