"""ggml's tensor types as GGUF files name them: enum value, name and block
geometry (docs/formats.md#block-types). Shared by the format readers and
writers and by the codecs (``ggml``, ``affine``)."""
from __future__ import annotations

from typing import NamedTuple


class GGMLType(NamedTuple):
    """One ggml tensor type: its enum value, name and block geometry."""

    id: int
    name: str
    block_size: int  # values per block
    type_size: int  # bytes per block


# The types of ggml's enum ggml_type that GGUF files hold. Left out: retired
# ids (4, 5, 31-33, 36-38), Q8_1 and Q8_K (ggml's internal dot-product
# formats, never written to files) and types newer than this table; a file
# holding any of them is rejected as an unknown type.
GGML_TYPES: dict[int, GGMLType] = {t.id: t for t in (
    GGMLType(0, "F32", 1, 4), GGMLType(1, "F16", 1, 2),
    GGMLType(2, "Q4_0", 32, 18), GGMLType(3, "Q4_1", 32, 20),
    GGMLType(6, "Q5_0", 32, 22), GGMLType(7, "Q5_1", 32, 24),
    GGMLType(8, "Q8_0", 32, 34),
    GGMLType(10, "Q2_K", 256, 84), GGMLType(11, "Q3_K", 256, 110),
    GGMLType(12, "Q4_K", 256, 144), GGMLType(13, "Q5_K", 256, 176),
    GGMLType(14, "Q6_K", 256, 210),
    GGMLType(16, "IQ2_XXS", 256, 66), GGMLType(17, "IQ2_XS", 256, 74),
    GGMLType(18, "IQ3_XXS", 256, 98), GGMLType(19, "IQ1_S", 256, 50),
    GGMLType(20, "IQ4_NL", 32, 18), GGMLType(21, "IQ3_S", 256, 110),
    GGMLType(22, "IQ2_S", 256, 82), GGMLType(23, "IQ4_XS", 256, 136),
    GGMLType(24, "I8", 1, 1), GGMLType(25, "I16", 1, 2),
    GGMLType(26, "I32", 1, 4), GGMLType(27, "I64", 1, 8),
    GGMLType(28, "F64", 1, 8), GGMLType(29, "IQ1_M", 256, 56),
    GGMLType(30, "BF16", 1, 2), GGMLType(34, "TQ1_0", 256, 54),
    GGMLType(35, "TQ2_0", 256, 66), GGMLType(39, "MXFP4", 32, 17),
)}
GGML_TYPE_IDS: dict[str, int] = {t.name: t.id for t in GGML_TYPES.values()}

F32, F16, BF16 = GGML_TYPE_IDS["F32"], GGML_TYPE_IDS["F16"], GGML_TYPE_IDS["BF16"]
Q8_0 = GGML_TYPE_IDS["Q8_0"]
