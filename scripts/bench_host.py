"""The host a benchmark ran on, named beside every figure (docs/benchmarks.md#how-runs-are-made)."""
from __future__ import annotations


def cpu_name() -> str:
    """This machine's CPU model as /proc/cpuinfo names it ("?" where it has none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"
