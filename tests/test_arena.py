"""gemma_cy/fast/arena.py: the fast engine's matrices copied out of the file map
into one arena, in the order asked, with the file's values intact."""
import numpy as np

from gemma_cy.api import open_weights
from gemma_cy.fast.arena import ALIGN_BYTES, pack_matrices
from gemma_cy.quant.tensors import Int8Tensor, Q8_0Tensor, quantize_q8_0
from gemma_cy.model.weights import LAYER_MATRICES


def _values(t):
    return t.q if isinstance(t, Int8Tensor) else t.blocks


def test_packed_matrices_equal_the_file_in_the_order_asked(tiny_model_path):
    weights = open_weights(str(tiny_model_path))
    c = weights.config
    order = [f"layers.{i}.{n}" for i in range(c.n_layers) for n in LAYER_MATRICES] + ["embed_tokens"]
    before = {n: np.array(_values(weights[n])) for n in order}  # copies, read before packing
    packed, arena = pack_matrices(weights.tensors, order + ["embed_tokens"])  # a name twice: packed once
    assert arena is not None
    starts = []
    for n in order:
        got = _values(packed[n])
        np.testing.assert_array_equal(got, before[n])
        assert not got.flags.writeable
        assert got.ctypes.data % ALIGN_BYTES == 0
        assert not np.shares_memory(got, _values(weights[n]))
        if isinstance(weights[n], Int8Tensor):
            assert packed[n].scale == weights[n].scale
        starts.append(got.ctypes.data)
    assert starts == sorted(starts) and len(set(starts)) == len(starts)  # one arena, in order
    # the source map's pages were only released: the file's values read back unchanged
    for n in order:
        np.testing.assert_array_equal(_values(weights[n]), before[n])


def test_tensors_already_in_memory_stay_where_they_are():
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    in_memory = Q8_0Tensor(quantize_q8_0(w))
    keep = in_memory.blocks.copy()
    packed, arena = pack_matrices({"m": in_memory}, ["m"])
    assert arena is None and packed["m"] is in_memory
    np.testing.assert_array_equal(in_memory.blocks, keep)


def test_packed_matrices_are_not_packed_again(tiny_model_path):
    """The arena is writable memory: dropping its pages would zero them, so
    a second packing must leave it alone (and copy nothing)."""
    weights = open_weights(str(tiny_model_path))
    order = [f"layers.0.{n}" for n in LAYER_MATRICES]
    packed, arena = pack_matrices(weights.tensors, order)
    want = {n: np.array(_values(packed[n])) for n in order}
    again, second = pack_matrices(packed, order)
    assert second is None
    for n in order:
        assert again[n] is packed[n]
        np.testing.assert_array_equal(_values(packed[n]), want[n])
