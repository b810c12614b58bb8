"""Resource bombs (docs/errors.md#resource-bombs): files that claim enormous
counts or sizes are refused before anything is allocated or looped over,
with one line, in under a second, within 64 MB of address space above the
process's baseline.

Each case runs in a subprocess that imports every reader first, then caps
its address space (RLIMIT_AS) at what it uses plus 64 MB, and opens the file
the way `gemma-cy` does (api.open_weights / api.open_tokenizer): an
allocation past the cap would be a MemoryError, which fails the test like
any error outside the package's own.
"""
import struct
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO

CAP_MB = 64

RUNNER = textwrap.dedent('''
    import resource, sys, time
    from gemma_cy import api
    from gemma_cy.errors import GemmaCyError
    import gemma_cy.formats.gguf_model, gemma_cy.formats.gmw, gemma_cy.formats.gmt, gemma_cy.formats.llama2c
    import gemma_cy.tokenizers.sp, gemma_cy.tokenizers.bpe, gemma_cy.tokenizers.llama2c

    def vm_bytes():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024

    what, path = sys.argv[1], sys.argv[2]
    open_it = api.open_weights if what == "weights" else api.open_tokenizer
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + {cap} * 2**20, resource.RLIM_INFINITY))
    start = time.perf_counter()
    try:
        open_it(path)
        print("accepted")
    except GemmaCyError as e:
        print(f"{{time.perf_counter() - start:.3f}}", type(e).__name__, str(e).replace("\\n", "<NEWLINE>"))
''').format(cap=CAP_MB)


def opened(what: str, path) -> tuple[float, str]:
    """(seconds, the error line) of opening ``path`` capped, or a failed assertion."""
    result = subprocess.run([sys.executable, "-c", RUNNER, what, str(path)], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr, result.stderr[-1500:]
    assert result.stdout != "accepted\n", "the bomb was accepted"
    seconds, kind, message = result.stdout.rstrip("\n").split(" ", 2)
    assert "<NEWLINE>" not in message
    return float(seconds), f"{kind}: {message}"


def s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def gguf(n_tensors: int, n_kv: int, body: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


DEEP = 10**6
BOMBS = {
    "2^40 tensors": gguf(2**40, 0, bytes(64)),
    "2^40 metadata entries": gguf(0, 2**40, bytes(64)),
    "a key of 2^62 bytes": gguf(0, 1, struct.pack("<Q", 2**62) + bytes(64)),
    "a string value of 2^62 bytes": gguf(0, 1, s(b"k") + struct.pack("<IQ", 8, 2**62) + bytes(64)),
    "an array of 2^62 items": gguf(0, 1, s(b"k") + struct.pack("<IIQ", 9, 0, 2**62) + bytes(64)),
    "an array of 2^62 strings": gguf(0, 1, s(b"k") + struct.pack("<IIQ", 9, 8, 2**62) + bytes(64)),
    "arrays of arrays 10^6 deep": gguf(0, 1, s(b"k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * DEEP
                                       + struct.pack("<IQ", 0, 1) + b"\0"),
    "a tensor of 2^20 x 2^20 x 2^20": gguf(1, 0, s(b"t") + struct.pack("<I3QIQ", 3, 2**20, 2**20, 2**20, 0, 0)
                                           + bytes(64)),
    "a tensor whose element count overflows int64": gguf(1, 0, s(b"t") + struct.pack("<I4QIQ", 4, *[2**20] * 4,
                                                                                          0, 0) + bytes(64)),
    "an n_vocab of 2^31": gguf(0, 1, s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**31) + s(b"a")),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_gguf_bombs_are_refused_at_once(tmp_path, name):
    path = tmp_path / "bomb.gguf"
    path.write_bytes(BOMBS[name])
    for what in ("weights", "tokenizer"):
        seconds, error = opened(what, path)
        assert error.startswith("ModelFormatError: ") and str(path) in error, error
        assert seconds < 1.0, (name, seconds)


def test_gmw1_with_huge_sizes(tmp_path):
    from gemma_cy.formats.gmw import _HEADER

    for field, value in (("vocab_size", 2**31), ("dim", 2**32 - 1), ("n_layers", 2**32 - 1)):
        counts = dict(n_layers=2, dim=256, n_heads=4, n_kv_heads=1, mlp_dim=1024, vocab_size=1024,
                      max_seq_len=256, head_dim=64)
        counts[field] = value
        path = tmp_path / f"{field}.gmw"
        path.write_bytes(_HEADER.pack(b"GMW1", 1, *counts.values(), 10000.0, bytes(20)) + bytes(4096))
        seconds, error = opened("weights", path)
        assert error.startswith("ModelFormatError: ") and seconds < 1.0, (field, error)


def test_gmt1_with_2_31_pieces(tmp_path):
    from gemma_cy.formats.gmt import HEADER

    path = tmp_path / "bomb.tok"
    path.write_bytes(HEADER.pack(b"GMT1", 1, 2**31, 1, 2, 0, 0, bytes(20)) + struct.pack("<IIf", 1, 0, 0.0) + b"a")
    seconds, error = opened("tokenizer", path)
    assert error.startswith("ModelFormatError: ") and seconds < 1.0, error


@pytest.mark.parametrize("header", [
    (2**31 - 1, 64, 2, 4, 4, 32000, 256),  # dim
    (64, 64, 2**31 - 1, 4, 4, 32000, 256),  # n_layers
    (64, 64, 2, 4, 4, 2**31 - 1, 256),  # vocab
    (64, 64, 2, 4, 4, -(2**31 - 1), 256),  # vocab, unshared classifier
    (64, 64, 2, 4, 4, 32000, 2**31 - 1),  # seq_len (the RoPE tables' rows)
])
def test_llama2c_checkpoint_with_huge_sizes(tmp_path, header):
    path = tmp_path / "bomb.bin"
    path.write_bytes(struct.pack("<7i", *header) + bytes(4096))
    seconds, error = opened("weights", path)
    assert error.startswith("ModelFormatError: ") and seconds < 1.0, error


def test_llama2c_tokenizer_with_a_huge_piece(tmp_path):
    path = tmp_path / "tokenizer.bin"
    path.write_bytes(struct.pack("<i", 2**31 - 1) + struct.pack("<fi", 0.0, 2**31 - 1) + b"abc")
    seconds, error = opened("tokenizer", path)
    assert error.startswith("ModelFormatError: ") and seconds < 1.0, error
