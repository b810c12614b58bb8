"""GMW1 reader and writer: cases found by mutation testing
(gemma_cy/formats/gmw.py, docs/formats.md#gmw1-weights).

Each test pins down a documented rule that tests/test_gmw.py states only
away from its boundary or for the default value.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from gemma_cy.errors import ModelFormatError
from gemma_cy.formats.gmw import gmw_config, gmw_layout, read_gmw, write_gmw
from gemma_cy.model.weights import expected_shapes
from gemma_cy.quant.tensors import Int8Tensor, quantize_per_tensor

SMALL = dict(n_layers=1, dim=8, n_heads=2, n_kv_heads=1, mlp_dim=12,
             vocab_size=10, max_seq_len=4, head_dim=4, rope_base=10000.0)
U32_MAX = 2**32 - 1


def small_tensors(config, seed: int = 0) -> dict[str, Int8Tensor]:
    """Random quantized tensors of every GMW1 tensor of ``config``."""
    rng = np.random.default_rng(seed)
    shapes = expected_shapes(config)
    return {name: quantize_per_tensor(rng.standard_normal(shapes[name]).astype(np.float32))
            for name, _ in gmw_layout(config)}


@pytest.mark.parametrize("rope_base", [500000.0, 1.0, 0.5])
def test_rope_base_round_trips(tmp_path, rope_base):
    """The header's rope_base (any finite f32 > 0, also 1 and below) is
    written and read back as the config's rope_base, not a default."""
    config = gmw_config(**{**SMALL, "rope_base": rope_base})
    assert config.rope_base == rope_base
    path = tmp_path / "r.gmw"
    write_gmw(path, config, small_tensors(config))
    assert read_gmw(path).config.rope_base == rope_base


def test_weights_name_the_file_they_were_read_from(tmp_path):
    """read_gmw's Weights carry the path as ``source`` (used in messages)."""
    config = gmw_config(**SMALL)
    path = tmp_path / "s.gmw"
    write_gmw(path, config, small_tensors(config))
    assert read_gmw(path).source == str(path)


def test_u32_max_counts_are_expressible(tmp_path):
    """A count of exactly 2**32 - 1 fits GMW1's u32 (the writer gets past
    the header check and stops at the missing tensors); 2**32 does not."""
    config = gmw_config(**{**SMALL, "max_seq_len": U32_MAX})
    with pytest.raises(ModelFormatError, match="missing tensor"):
        write_gmw(tmp_path / "u.gmw", config, {})
    config = gmw_config(**{**SMALL, "max_seq_len": U32_MAX + 1})
    with pytest.raises(ModelFormatError, match="does not fit"):
        write_gmw(tmp_path / "u.gmw", config, {})


@pytest.mark.parametrize("bad", [math.inf, -math.inf, -1.0, -1e-30, 1e39])
def test_writer_rejects_every_scale_read_gmw_would_refuse(tmp_path, bad):
    """The writer refuses a scale that is infinite, negative or beyond f32
    (the reader's rule: finite and >= 0), without a NumPy overflow warning."""
    config = gmw_config(**SMALL)
    tensors = small_tensors(config)
    tensors["lm_head"] = Int8Tensor(tensors["lm_head"].q, bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModelFormatError, match="scale"):
            write_gmw(tmp_path / "w.gmw", config, tensors)


def test_writer_accepts_a_zero_scale(tmp_path):
    """A zero scale is valid (that tensor dequantizes to zeros), so the
    writer accepts it and the reader gives it back."""
    config = gmw_config(**SMALL)
    tensors = small_tensors(config)
    tensors["lm_head"] = Int8Tensor(tensors["lm_head"].q, np.float32(0.0))
    write_gmw(tmp_path / "z.gmw", config, tensors)
    assert read_gmw(tmp_path / "z.gmw").tensors["lm_head"].scale == 0.0


def test_writer_rejects_a_rope_base_beyond_f32_without_a_warning(tmp_path):
    """A rope_base that overflows f32 is not expressible: ModelFormatError,
    not a NumPy overflow warning on the way."""
    config = gmw_config(**SMALL).with_changes(rope_base=1e39)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModelFormatError, match="rope_base"):
            write_gmw(tmp_path / "w.gmw", config, small_tensors(config))
