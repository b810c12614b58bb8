"""`gemma-cy eval --plot`: the evaluation as a picture (docs/generation.md#evaluation).

matplotlib is an optional extra (``pip install gemma-cy[plot]``); without
it, asking for a plot is one line saying so. ``check_plot_path`` runs
before the evaluation, so that a plot which cannot be written is refused
before minutes of work, not after.
"""
from __future__ import annotations

import os

from ..errors import ParameterError


def check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ParameterError("--plot needs matplotlib: pip install 'gemma-cy[plot]' (or pip install matplotlib)") \
            from None


def check_plot_path(path: str) -> None:
    """matplotlib is installed, ``path``'s extension is a format it writes,
    and its directory exists and is writable; ParameterError otherwise."""
    check_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        raise ParameterError(f"--plot {path}: the name must end in a format matplotlib writes "
                             f"({', '.join('.' + f for f in sorted(formats))})")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ParameterError(f"--plot {path}: no directory {directory}")
    if not os.access(directory, os.W_OK) or os.path.isdir(path):
        raise ParameterError(f"--plot {path}: cannot write there")


def draw_evaluation(result, title: str):
    """The figure: KL divergence by scored position (when there is a
    baseline) and the per-op relative errors by layer (when computed)."""
    check_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

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
            ax.set_title(f"{title}: KL divergence against {result.baseline}, mean {result.kl_mean:.3g}")
        else:
            ops = sorted({r["op"] for r in result.per_layer})
            # one colour per op: tab20 has 20 distinct ones, the default cycle only 10
            colours = plt.get_cmap("tab20" if len(ops) > 10 else "tab10")
            for i, op in enumerate(ops):
                rows = sorted((r["layer"], r["relative_rms"]) for r in result.per_layer if r["op"] == op)
                ax.plot([r[0] for r in rows], [max(r[1], 1e-12) for r in rows], marker="os^vD"[i % 5], ms=3,
                        color=colours(i % colours.N), label=op)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
            ax.set_xlabel("layer (-1 embedding, n_layers output)")
            ax.set_ylabel("relative rms error")
            ax.set_yscale("log")
            ax.legend(ncol=4, fontsize=8)
            ax.set_title(f"each op against {result.baseline}, on the same inputs")
    fig.tight_layout()
    return fig


def plot_evaluation(result, path: str, title: str) -> None:
    """``draw_evaluation`` written to ``path`` (PNG, or the format its extension names)."""
    import matplotlib.pyplot as plt

    fig = draw_evaluation(result, title)
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as e:
        raise ParameterError(f"--plot {path}: cannot write ({getattr(e, 'strerror', None) or e})") from None
    finally:
        plt.close(fig)
