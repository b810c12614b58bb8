"""The reference's kernels: NumPy functions that know nothing of the graph
(norms, RoPE, softmax, soft-cap, the gate activations), each over the last
axis of its input. The layers (layers.py) are written with them; the fast
engine's are the k_* kernels of gemma_cy/fast/kernels/.
"""
from __future__ import annotations

import numpy as np

GELU_TANH_C = np.float32(np.sqrt(2.0 / np.pi))  # sqrt(2/pi) of the tanh approximation
GELU_TANH_A = np.float32(0.044715)


def rmsnorm(x: np.ndarray, gain: np.ndarray, eps: float, one_plus: bool) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * g, or * (1 + g) (Gemma), over the last axis.

    x (..., n), gain (n,) -> (..., n). The last axis lets the same function
    normalize each head of q or k (q/k-norm).
    """
    ms = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1)
    g = np.float32(1.0) + gain if one_plus else gain  # (n,)
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps))) * g


def rope_cos_sin(pos: int, head_dim: int, base: float, freq_factors: np.ndarray | None = None,
                 scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the angles pos * base^(-2j/hd) [/ freq_factors[j]], j < hd/2, [times
    scale], as f32 (hd/2,). ``head_dim`` is the rotated width (config.rotary_dims).

    The angles are computed in f64 and rounded once: in f32, pos * inv_freq
    loses ~pos * 6e-8 rad (1e-3 at 16k positions), which is accuracy the
    reference should not give away. The fast path may tabulate these.
    ``freq_factors`` (Llama 3's rope_freqs, docs/model.md#llama-3) divide
    each pair's frequency: 1 keeps it, 8 turns it 8 times slower.
    ``scale`` is LongRoPE's attention factor (docs/model.md#phi-3), applied
    in f64 before the one rounding.
    """
    j = np.arange(head_dim // 2, dtype=np.float64)  # (hd/2,)
    inv_freq = float(base) ** (-2.0 * j / head_dim)  # (hd/2,)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)  # (hd/2,)
    angle = pos * inv_freq  # (hd/2,)
    if scale != 1.0:
        return (np.cos(angle) * scale).astype(np.float32), (np.sin(angle) * scale).astype(np.float32)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rope(x: np.ndarray, pos: int, base: float, pairing: str, freq_factors: np.ndarray | None = None,
         rot_dims: int = 0, scale: float = 1.0) -> np.ndarray:
    """Rotate each head's pairs by pos * inv_freq_j: x (n, hd) -> (n, hd).

    pairing "interleaved": pair j is (x[2j], x[2j+1]) (seed, docs/model.md#the-seed-model-gmw1);
    "half_split": pair j is (x[j], x[j + hd/2]) (Gemma, HF rotate_half).
    Pair (a, b) -> (a cos - b sin, a sin + b cos). With ``rot_dims`` (> 0,
    < hd) only each head's first rot_dims values are rotated, as a head of
    that width, and the rest pass unchanged (Phi-4-mini, docs/model.md#phi-3).
    """
    if rot_dims and rot_dims < x.shape[-1]:
        out = x.copy()  # (n, hd)
        out[:, :rot_dims] = rope(x[:, :rot_dims], pos, base, pairing, freq_factors, 0, scale)
        return out
    head_dim = x.shape[-1]
    cos, sin = rope_cos_sin(pos, head_dim, base, freq_factors, scale)  # (hd/2,) each
    if pairing == "interleaved":
        a, b = x[:, 0::2], x[:, 1::2]  # (n, hd/2) each
    else:
        a, b = x[:, :head_dim // 2], x[:, head_dim // 2:]  # (n, hd/2) each
    ra = a * cos - b * sin  # (n, hd/2)
    rb = a * sin + b * cos  # (n, hd/2)
    out = np.empty_like(x)  # (n, hd)
    if pairing == "interleaved":
        out[:, 0::2], out[:, 1::2] = ra, rb
    else:
        out[:, :head_dim // 2], out[:, head_dim // 2:] = ra, rb
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    """Stable softmax over the last axis: exp(x - max) / sum."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap): squashes x into (-cap, cap) (Gemma 2)."""
    c = np.float32(cap)
    return c * np.tanh(x / c)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), with sigmoid(x) = exp(-log(1 + exp(-x))): no overflow."""
    return x * np.exp(-np.logaddexp(np.float32(0.0), -x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GELU, tanh approximation)."""
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(GELU_TANH_C * (x + GELU_TANH_A * x * x * x)))


GATE_ACTIVATION_FUNCTIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def window_start(pos: int, window: int) -> int:
    """First position a query at ``pos`` attends to: the last ``window``
    positions, ``pos`` included; window 0 = all, from 0."""
    return max(0, pos - window + 1) if window > 0 else 0
