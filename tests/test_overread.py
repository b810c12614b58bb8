"""The kernels never read or write past the end of their arrays
(docs/numerics.md#kernels-and-memory): every input and output of every kernel
of every SIMD module this CPU runs is placed so that its last byte is the last
byte before a PROT_NONE page, for every length around the vector widths and
tails. A read or write past the end then faults instead of passing quietly.
It runs in a subprocess, where a fault is a failed exit, not a dead test run.
"""
import subprocess
import sys
import textwrap

from helpers import AVAILABLE, REPO

GUARD = textwrap.dedent('''
    import ctypes, mmap, sys
    import numpy as np

    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def guarded(values):
        """A copy of ``values`` whose last byte is right before a PROT_NONE page."""
        values = np.ascontiguousarray(values)
        usable = -(-max(values.nbytes, 1) // PAGE) * PAGE
        mm = mmap.mmap(-1, usable + PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if libc.mprotect(base + usable, PAGE, 0) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")
        out = np.frombuffer(mm, dtype=values.dtype, count=values.size,
                            offset=usable - values.nbytes).reshape(values.shape)
        out[...] = values
        return out
''')

KERNELS = textwrap.dedent('''
    from gemma_cy.fast import ops
    from gemma_cy.quant.affine import AffineTensor
    from gemma_cy.quant.tensors import Int8Tensor, Q8_0Tensor

    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.uniform(-1, 1, shape).astype(np.float32)
    i8 = lambda *shape: rng.integers(-128, 128, shape).astype(np.int8)

    def q8_0(*shape):
        b = np.zeros(shape + (34,), np.uint8)
        b[..., :2] = np.array([0.01], np.float16).view(np.uint8)
        b[..., 2:] = rng.integers(0, 256, shape + (32,), dtype=np.uint8)
        return b

    calls = 0
    for isa in sys.argv[1].split(","):
        m = ops.module_for(isa)
        for n in range(1, 100):
            g = guarded
            m.dot_i8(g(i8(n)), g(f32(n)), 0.01)
            m.dot_f32(g(f32(n)), g(f32(n)))
            for rows in (1, 3, 4, 5):
                m.gemv_i8(g(i8(rows, n)), 0.01, g(f32(n)), out=g(np.zeros(rows, np.float32)))
                m.gemv_i8(g(i8(rows, n)), 0.01, g(f32(n)), resident=True)
            m.scores(g(f32(2, n)), g(f32(9, n)))
            m.weighted_rows(g(f32(2, 17)), g(f32(17, n)), g(f32(2, n)), out=g(np.zeros((2, n), np.float32)))
            m.axpy(0.5, g(f32(n)), g(f32(n)), out=g(np.zeros(n, np.float32)))
            m.softcap(g(f32(n)), 30.0, out=g(np.zeros(n, np.float32)))
            m.rmsnorm(g(f32(n)), g(f32(n)), 1e-6, False, out=g(np.zeros(n, np.float32)))
            m.softmax(g(f32(n)), out=g(np.zeros(n, np.float32)))
            m.silu_mul(g(f32(n)), g(f32(n)), out=g(np.zeros(n, np.float32)))
            m.gelu_tanh_mul(g(f32(n)), g(f32(n)), out=g(np.zeros(n, np.float32)))
            m.add(g(f32(n)), g(f32(n)), out=g(np.zeros(n, np.float32)))
            m.dequantize_i8(g(i8(n)), 0.01, out=g(np.zeros(n, np.float32)))
            if n % 2 == 0:
                m.rope(g(f32(3, n)), 5, 10000.0, "half_split", out=g(np.zeros((3, n), np.float32)))
                m.rope(g(f32(3, n)), 5, 10000.0, "interleaved", out=g(np.zeros((3, n), np.float32)))
            calls += 22
        for nb in range(1, 40):
            m.dot_q8_0(g(q8_0(nb)), g(f32(32 * nb)))
            for rows in (1, 3, 4, 5):
                m.gemv_q8_0(g(q8_0(rows, nb)), g(f32(32 * nb)), out=g(np.zeros(rows, np.float32)))
            m.dequantize_q8_0(g(q8_0(nb)), out=g(np.zeros(32 * nb, np.float32)))
            m.quantize_q8(g(f32(32 * nb)))
            calls += 7
            for rows in (1, 17):  # the q8 GEMV and GEMM of every other layout (avx512: panels of 16 rows)
                for positions in (1, 2):
                    xp = g(f32(positions, 32 * nb))
                    m.gemm(Int8Tensor(g(i8(rows, 32 * nb)), np.float32(0.01)), xp, activations="q8")
                    m.gemm(Q8_0Tensor(g(q8_0(rows, nb))), xp, activations="q8")
                    for sub, offset in ((32, True), (32, False), (16, False), (16, True)):
                        records = rng.integers(0, 256, (rows, 32 * nb // sub, sub + 4 + 4 * offset), dtype=np.uint8)
                        m.gemm(AffineTensor(g(records), sub, offset, "test"), xp, activations="q8")
                    calls += 6
        from gemma_cy.quant.affine import Q4_KTensor
        for nb in range(1, 5):  # Q4_K super-blocks of 256 (the GEMV, the GEMM, the q8 mode)
            for rows in (1, 3):
                raw = rng.integers(0, 256, (rows, nb, 144), dtype=np.uint8)
                raw[..., 0:4] = np.array([0.01, 0.001], np.float16).view(np.uint8)
                t = Q4_KTensor.from_raw(raw, (rows, 256 * nb))
                t = Q4_KTensor(g(t.blocks), g(t.ab))
                for positions in (1, 2):
                    m.gemm(t, g(f32(positions, 256 * nb)))
                    m.gemm(t, g(f32(positions, 256 * nb)), activations="q8")
                m.matrix_row(t, rows - 1)
                calls += 5
        from gemma_cy.quant.ggml import Q5_0Tensor
        for nb in range(1, 12):  # Q5_0 blocks of 22 bytes (the GEMV, the GEMM, the q8 mode, a row)
            for rows in (1, 3):
                raw = rng.integers(0, 256, (rows, nb, 22), dtype=np.uint8)
                raw[..., 0:2] = np.array([0.01], np.float16).view(np.uint8)
                t = Q5_0Tensor(g(raw))
                for positions in (1, 2):
                    m.gemm(t, g(f32(positions, 32 * nb)))
                    m.gemm(t, g(f32(positions, 32 * nb)), activations="q8")
                m.matrix_row(t, rows - 1)
                calls += 5
        from gemma_cy.quant.ggml import Q4_1Tensor
        for nb in range(1, 12):  # Q4_1 blocks of 20 bytes (the GEMV, the GEMM, the q8 mode, a row)
            for rows in (1, 3, 7):
                raw = rng.integers(0, 256, (rows, nb, 20), dtype=np.uint8)
                raw[..., 0:4] = np.array([0.01, -0.05], np.float16).view(np.uint8)
                t = Q4_1Tensor(g(raw))
                for positions in (1, 2, 5):
                    m.gemm(t, g(f32(positions, 32 * nb)))
                    m.gemm(t, g(f32(positions, 32 * nb)), activations="q8")
                m.matrix_row(t, rows - 1)
                calls += 7
    print("ok", calls)
''')


def run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_no_kernel_reads_or_writes_past_its_arrays():
    result = run(GUARD + KERNELS, ",".join(AVAILABLE))
    assert result.returncode == 0, f"exit {result.returncode} (a fault is -11): {result.stderr[-1500:]}"
    assert result.stdout.startswith("ok ") and int(result.stdout.split()[1]) > 1000


def test_the_guard_page_faults_on_a_read_past_the_end():
    """The test above can fail: reading one value past a guarded array
    kills the process with SIGSEGV."""
    ok = run(GUARD + "a = guarded(np.ones(7, np.float32)); print(float(a.sum()))")
    assert ok.returncode == 0 and ok.stdout.strip() == "7.0", ok.stderr
    past = run(GUARD + textwrap.dedent('''
        a = guarded(np.ones(7, np.float32))
        beyond = np.lib.stride_tricks.as_strided(a, shape=(8,), strides=(4,))
        print(float(beyond.sum()))
    '''))
    assert past.returncode == -11, (past.returncode, past.stderr[-500:])
