"""Build of gemma-cy's Cython extensions.

Compiler directives are set once here. Environment switches:
  GEMMA_CY_NO_NATIVE=1   do not pass -march=native (portable wheels)
  GEMMA_CY_DEBUG=1       bounds/wraparound/initialized checks back on, -O0 -g
"""
import os
import platform

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("GEMMA_CY_DEBUG", "") not in ("", "0")
NATIVE = os.environ.get("GEMMA_CY_NO_NATIVE", "") in ("", "0") and not DEBUG

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "embedsignature": True,
}
COMPILE_ARGS = ["-O0", "-g"] if DEBUG else ["-O3"]
if NATIVE:
    COMPILE_ARGS.append("-march=native")


def extension(name: str, sources: list[str], extra_args: tuple[str, ...] = (),
              isa_args: tuple[str, ...] | None = None) -> Extension:
    """One Cython extension module with the shared flags.

    isa_args: the module's own instruction-set flags, used instead of
    -march=native, so that it runs on every CPU with that ISA whatever the
    build machine had (one build, dispatch at run time: gemma_cy.ops).
    """
    args = COMPILE_ARGS if isa_args is None else [a for a in COMPILE_ARGS if a != "-march=native"]
    return Extension(
        name,
        sources,
        include_dirs=[numpy.get_include()],
        extra_compile_args=args + list(isa_args or ()) + list(extra_args),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


# The kernels are built once per instruction set (gemma_cy/fast/simd_<isa>.pyx, sources
# in gemma_cy/fast/kernels/ and the forward pass in gemma_cy/fast/forward.pxi), each
# with its own -m flags and never -march=native; gemma_cy.fast.ops picks one at
# import. "generic" has no -m flags, so it runs anywhere.
MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
# A module without FMA intrinsics of its own for a kernel runs the portable C loop
# (kernels/common.pxi), which must give one order of operations wherever gcc
# inlines it: no FMA contraction (a contracted and an uncontracted copy of one
# attention score differ in the last bit; docs/numerics.md#bit-for-bit).
PORTABLE = ("-ffp-contract=off",)
SIMD_FLAGS: dict[str, tuple[str, ...]] = {"generic": PORTABLE}
if MACHINE == "x86_64":
    # Every AVX2 and AVX-512 CPU has F16C (gemma_cy.fast.cpu_features checks
    # it with the rest); these two modules convert f16 block scales with it
    # (kernels/common.pxi, _block_d), the others from a table.
    SIMD_FLAGS["avx2"] = ("-mavx2", "-mfma", "-mf16c")
    # VNNI (vpdpbusd) runs the q8 mode's GEMM; an AVX-512 CPU without it
    # (Skylake-SP) runs the avx2 module (gemma_cy.fast.ops.REQUIRES).
    SIMD_FLAGS["avx512"] = ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                            *PORTABLE)
elif MACHINE == "aarch64":
    SIMD_FLAGS["neon"] = PORTABLE

EXTENSIONS = [
    extension("gemma_cy.fast.cpu_features", ["gemma_cy/fast/cpu_features.pyx"]),
    extension("gemma_cy.fast.faults", ["gemma_cy/fast/faults.pyx"]),
    extension("gemma_cy.fast.token_mask", ["gemma_cy/fast/token_mask.pyx"]),
    extension("gemma_cy.formats.string_scan", ["gemma_cy/formats/string_scan.pyx"]),
    *(extension(f"gemma_cy.fast.simd_{isa}", [f"gemma_cy/fast/simd_{isa}.pyx"], isa_args=flags)
      for isa, flags in SIMD_FLAGS.items()),
]

setup(
    # The NumPy reference lives in the repo folder reference/ but installs as
    # gemma_cy_reference: a bare top-level "reference" would squat a generic
    # name in site-packages.
    packages=["gemma_cy", "gemma_cy.commands", "gemma_cy.fast", "gemma_cy.formats", "gemma_cy.generation",
              "gemma_cy.model", "gemma_cy.quant", "gemma_cy.server", "gemma_cy.tokenizers", "gemma_cy_reference"],
    package_dir={"gemma_cy_reference": "reference"},
    package_data={"gemma_cy.fast": ["*.pxd", "*.pyx", "*.pxi", "kernels/*.pxi"], "gemma_cy.server": ["chat.html"]},
    ext_modules=cythonize(EXTENSIONS, compiler_directives=DIRECTIVES,
                          annotate=os.environ.get("GEMMA_CY_ANNOTATE", "") not in ("", "0")),
    zip_safe=False,
)
