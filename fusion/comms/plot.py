"""The schedule as a picture: compute and communication as two lanes, exposed communication in red.

Optional: needs matplotlib (``uv run --extra plot``), imported only when a picture is drawn. A panel comes from
the simulation (:func:`lanes_of_timeline`, any machine) or from a kept torch.profiler trace
(:func:`fusion.comms.profile.lanes_of_trace`, a GPU run's kernels).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fusion.comms.profile import Lanes, _union

PLOT_HINT = "--plot needs matplotlib (the 'plot' extra). Fix: uv run --extra plot python -m fusion.overlap --plot F.png"


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def lanes_of_timeline(timeline) -> Lanes:
    """A simulated :class:`~fusion.comms.units.Timeline` as lanes, in µs (the trace's unit)."""
    compute = [(name, s * 1e3, e * 1e3) for name, s, e in timeline.spans]
    comm = [(c.start.name, c.began_ms * 1e3, c.ended_ms * 1e3) for c in timeline.collectives]
    return Lanes(compute, comm)


def _exposed(lanes: Lanes) -> list[tuple[float, float]]:
    """The intervals where a collective runs and no compute does."""
    busy = _union([(s, e) for _, s, e in lanes.compute])
    out = []
    for _, s, e in lanes.comm:
        cursor = s
        for a, b in busy:
            if b <= cursor or a >= e:
                continue
            if a > cursor:
                out.append((cursor, a))
            cursor = max(cursor, b)
        if cursor < e:
            out.append((cursor, e))
    return out


def _color(name: str) -> str:
    n = name.lower()
    if "gemm" in n or "mm" in n.split("_") or n.startswith(("mm", "addmm", "sm90", "cutlass", "ampere", "nvjet")):
        return "#1f4e9c"  # matmuls
    return "#7fa7dc" if ("region" in n or "triton" in n or "fused" in n) else "#9a9a9a"


def draw_lanes(panels: list[tuple[str, Lanes]], path: str | Path) -> Path:
    """One row per panel (title, lanes): compute on top, communication below, exposed parts red. Writes a PNG."""
    if not have_matplotlib():
        raise RuntimeError(PLOT_HINT)
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 1.5 * len(panels) + 0.8), squeeze=False, sharex=True)
    for ax, (title, lanes) in zip(axes[:, 0], panels, strict=True):
        spans = lanes.compute + lanes.comm
        t0 = min((s for _, s, _ in spans), default=0.0)
        ms = lambda s, e, t0=t0: ((s - t0) / 1e3, (e - s) / 1e3)  # noqa: E731
        ax.broken_barh([ms(s, e) for _, s, e in lanes.compute], (1.1, 0.8),
                       facecolors=[_color(n) for n, _, _ in lanes.compute], edgecolor="white", linewidth=0.3)  # fmt: skip
        ax.broken_barh([ms(s, e) for _, s, e in lanes.comm], (0.1, 0.8), facecolors="#f0a030", edgecolor="white",
                       linewidth=0.5)  # fmt: skip
        ax.broken_barh([ms(s, e) for s, e in _exposed(lanes)], (0.1, 0.8), facecolors="#d62728", alpha=0.85)
        ax.set_yticks([0.5, 1.5], ["network", "compute"])
        ax.set_ylim(0, 2)
        ax.set_title(f"{title}: communication {lanes.comm_us() / 1e3:.2f} ms, exposed {lanes.exposed_us() / 1e3:.2f} ms",
                     fontsize=9, loc="left")  # fmt: skip
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms from the step's first kernel (one scale for every row)")
    axes[-1, 0].tick_params(labelbottom=True)
    fig.legend(handles=[Patch(color="#1f4e9c", label="matmul"), Patch(color="#7fa7dc", label="fused region"),
                        Patch(color="#9a9a9a", label="other"), Patch(color="#f0a030", label="collective, hidden"),
                        Patch(color="#d62728", label="collective, exposed")],
               loc="lower center", ncol=5, fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
