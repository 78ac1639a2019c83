"""Pictures of what a lesson computed: ``uv run --extra plot python -m fusion.<phase> --plot FILE.png``.

Optional, like Phase 4's roofline (``fusion.bench.plot``): matplotlib is the ``plot`` extra, imported only when a
picture is drawn; without it, one error names the command that installs it.

* :mod:`fusion.viz.regions` — Phase 6: an aten graph, each node coloured by its fusion region, each cut labelled
  with the reason its node is not fusible.
* :mod:`fusion.viz.kernels` — Phase 9: what one call of a compiled model runs, in order: generated kernels, library
  calls, and what the generator left to aten, with why.

:data:`PICTURES` says which lesson draws which picture; ``fusion.common.lesson_cli`` offers ``--plot`` to those
lessons and, after the lesson ran, calls the picture's ``draw_lesson(lesson, path, quick)`` with the lesson's module
(the ``__main__`` module under ``python -m``): a picture reads the lesson's own functions from it (its regions, its
backend's reports), so nothing here imports a lesson.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType

# lesson module -> the module here whose draw_lesson(lesson, path, quick) draws its picture
PICTURES = {
    "fusion.regions": "fusion.viz.regions",
    "fusion.backend": "fusion.viz.kernels",
}


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def extra(lesson: str | None, path: str = "FILE.png") -> str:
    """What a picture needs, and the command that installs it and draws the picture."""
    return f"needs matplotlib, the 'plot' extra: uv run --extra plot python -m {lesson} --plot {path}"


def plot_hint(lesson: str | None, path: str = "FILE.png") -> str:
    """The one error for a picture without matplotlib: the command that installs the ``plot`` extra and runs it."""
    return f"--plot {extra(lesson, path).replace(': uv run', '. Fix: uv run')}"


def pyplot(lesson: str = "fusion.<phase>"):
    """``matplotlib.pyplot`` on the file-only Agg backend, or a RuntimeError naming the fix."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(plot_hint(lesson)) from e
    return plt


def picture_of(lesson: str | None) -> Callable[[ModuleType, str, bool], None] | None:
    """The ``draw_lesson`` function of ``lesson``'s picture (``fusion.regions``), or None where it has none."""
    name = PICTURES.get(lesson or "")
    return None if name is None else importlib.import_module(name).draw_lesson


def palette(n: int) -> list:
    """``n`` colours, one per region or kernel (matplotlib's tab10, cycled)."""
    cmap = pyplot().get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]
