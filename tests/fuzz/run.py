"""Coverage-guided fuzzing of gemma-cy's readers with atheris (docs/errors.md#fuzzing).

    python tests/fuzz/run.py NAME [--seconds 60]      one harness (names: tests/fuzz/harnesses.py)
    python tests/fuzz/run.py --all [--seconds 60]     every harness, one after the other
    python tests/fuzz/run.py --write-seeds            (re)make tests/fuzz/corpus/*/seed-*

Each run starts from the committed seeds (tests/fuzz/corpus/NAME) and keeps
what it learns in build/fuzz/NAME (not committed). An input that makes a
target raise anything but a GemmaCyError, crash or run past --timeout
seconds is written to tests/fuzz/crashes/NAME-...; once fixed, move it to
tests/fuzz/regressions/NAME/, which `make test` replays. The Python code of
gemma_cy and gemma_cy_reference is instrumented for coverage; the Cython
kernels underneath run as built (`make fuzz` uses the bounds-checked debug
build, so an out-of-bounds index there is an IndexError, not a silent read).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS, CRASHES, WORK = HERE / "corpus", HERE / "crashes", ROOT / "build" / "fuzz"
sys.path.insert(0, str(HERE.parent))


def write_seeds() -> None:
    from fuzz.harnesses import SEEDS
    for name, make in SEEDS.items():
        folder = CORPUS / name
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("seed-*"):
            old.unlink()
        for i, data in enumerate(make()):
            (folder / f"seed-{i}").write_bytes(data)
        print(f"{name}: {len(list(folder.iterdir()))} seeds")


def without_comparison_leak(atheris, target):
    """``target`` with atheris's comparison hook replaced while it runs.

    atheris (3.0.0) rewrites every ``a < b`` of the instrumented code into a
    call of ``atheris._trace_cmp``, and that native hook keeps a reference to
    the result of every comparison whose operands are other objects: each
    ``array >= 0.5`` in a reader leaks its result array. In the llama2c_model
    harness that was ~1.8 KB per input, until libFuzzer's 3 GB RSS limit
    stopped the run (docs/errors.md#fuzzing). The instrumented code looks the
    hook up on the module at each call, and ``atheris.Fuzz()`` binds the
    module's hook anew, so the wrapper installs its own at the first input:
    str, bytes and number comparisons (the ones libFuzzer learns from) still
    go to the native hook; the others are evaluated here."""
    import operator
    from atheris.version_dependent import CMP_OP_SHIFT_AMOUNT
    ops = (operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge)  # dis.cmp_op order
    traced = (str, bytes, int, float, bool)
    native = []

    def trace_cmp(left, right, op, counter, is_const):
        if type(left) in traced and type(right) in traced:
            return native[0](left, right, op, counter, is_const)
        return ops[op >> CMP_OP_SHIFT_AMOUNT](left, right)

    def run(data: bytes) -> None:
        if atheris._trace_cmp is not trace_cmp:
            native[:] = [atheris._trace_cmp]
            atheris._trace_cmp = trace_cmp
        target(data)

    return run


def fuzz(name: str, seconds: int, timeout: int, rss_limit_mb: int) -> int:
    import atheris

    with atheris.instrument_imports(include=["gemma_cy", "gemma_cy_reference", "fuzz"]):
        from fuzz.harnesses import TARGETS
    if name not in TARGETS:
        sys.exit(f"unknown harness {name!r}; one of {', '.join(TARGETS)}")
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    CRASHES.mkdir(parents=True, exist_ok=True)
    args = [sys.argv[0], str(work), str(CORPUS / name), f"-max_total_time={seconds}", f"-timeout={timeout}",
            f"-rss_limit_mb={rss_limit_mb}", "-max_len=200000", f"-artifact_prefix={CRASHES}/{name}-",
            "-print_final_stats=1"]
    atheris.Setup(args, without_comparison_leak(atheris, TARGETS[name]))
    atheris.Fuzz()
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", nargs="?")
    p.add_argument("--all", action="store_true")
    p.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", 60)))
    p.add_argument("--timeout", type=int, default=3, help="seconds one input may take (a hang past it is a crash)")
    p.add_argument("--rss-limit-mb", type=int, default=3072,
                   help="libFuzzer's memory limit (0: none). libFuzzer reads the process's peak RSS, which a "
                        "child inherits from the process that started it (Linux keeps it across exec), so a "
                        "harness started from a large process needs 0")
    p.add_argument("--write-seeds", action="store_true")
    a = p.parse_args()
    if a.write_seeds:
        write_seeds()
        return 0
    if a.all:
        from fuzz.harnesses import TARGETS
        failed = []
        for name in TARGETS:  # one process each: libFuzzer runs one target per process
            code = subprocess.call([sys.executable, __file__, name, "--seconds", str(a.seconds),
                                    "--rss-limit-mb", str(a.rss_limit_mb),
                                    "--timeout", str(a.timeout)])
            if code:
                failed.append(name)
        print("fuzz: " + (f"crashes in {', '.join(failed)} (see {CRASHES})" if failed else "no crash"))
        return 1 if failed else 0
    if not a.name:
        p.error("give a harness name or --all")
    return fuzz(a.name, a.seconds, a.timeout, a.rss_limit_mb)


if __name__ == "__main__":
    sys.exit(main())
