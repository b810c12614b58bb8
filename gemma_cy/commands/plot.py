"""`gemma-cy eval --plot`: the evaluation as a picture (docs/generation.md#evaluation).

matplotlib is an optional extra (``pip install gemma-cy[plot]``); without
it, asking for a plot is one line saying so.
"""
from __future__ import annotations

from ..errors import ParameterError


def check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ParameterError("--plot needs matplotlib: pip install 'gemma-cy[plot]' (or pip install matplotlib)") \
            from None


def plot_evaluation(result, path: str, title: str) -> None:
    """KL divergence by scored position (when there is a baseline) and the
    per-op relative errors by layer (when computed), in one PNG."""
    check_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("kl", "layers") if (p == "kl" and result.per_position_kl)
              or (p == "layers" and result.per_layer)]
    if not panels:
        raise ParameterError("--plot: nothing to draw without a baseline (--against...)")
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.5 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        if panel == "kl":
            ax.plot(result.per_position_kl, lw=0.8)
            ax.set_xlabel("scored position")
            ax.set_ylabel("KL(baseline || model)")
            ax.set_yscale("log")
            ax.set_title(f"{title}: KL divergence, mean {result.kl_mean:.3g}")
        else:
            ops = sorted({r["op"] for r in result.per_layer})
            for op in ops:
                rows = sorted((r["layer"], r["relative_rms"]) for r in result.per_layer if r["op"] == op)
                ax.plot([r[0] for r in rows], [max(r[1], 1e-12) for r in rows], marker="o", ms=3, label=op)
            ax.set_xlabel("layer (-1 embedding, n_layers output)")
            ax.set_ylabel("relative rms error")
            ax.set_yscale("log")
            ax.legend(ncol=4, fontsize=8)
            ax.set_title("each op on the same inputs")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise ParameterError(f"--plot {path}: cannot write ({e.strerror or e})") from None
    finally:
        plt.close(fig)
