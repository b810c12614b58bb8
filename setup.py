"""Build of gemma-cy's Cython extensions.

Compiler directives are set once here. Environment switches:
  GEMMA_CY_NO_NATIVE=1   do not pass -march=native (portable wheels)
  GEMMA_CY_DEBUG=1       bounds/wraparound/initialized checks back on, -O0 -g
"""
import os

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


def extension(name: str, sources: list[str], extra_args: tuple[str, ...] = ()) -> Extension:
    """One Cython extension module with the shared flags."""
    return Extension(
        name,
        sources,
        include_dirs=[numpy.get_include()],
        extra_compile_args=COMPILE_ARGS + list(extra_args),
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


EXTENSIONS = [
    extension("gemma_cy.cpu_features", ["gemma_cy/cpu_features.pyx"]),
]

setup(
    # The NumPy reference lives in the repo folder reference/ but installs as
    # gemma_cy_reference: a bare top-level "reference" would squat a generic
    # name in site-packages.
    packages=["gemma_cy", "gemma_cy.formats", "gemma_cy_reference"],
    package_dir={"gemma_cy_reference": "reference"},
    package_data={"gemma_cy": ["*.pxd", "*.pyx"]},
    ext_modules=cythonize(EXTENSIONS, compiler_directives=DIRECTIVES,
                          annotate=os.environ.get("GEMMA_CY_ANNOTATE", "") not in ("", "0")),
    zip_safe=False,
)
