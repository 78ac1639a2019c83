"""What a pass is (:class:`Pass`), the stage of the pipeline it rewrites, and the options of the compile in progress.

A pass rewrites a graph in place. Most rewrite each aten graph AOTAutograd hands the backend (stage ``"aten"``, the
driver's list); two stages run passes of their own at their own point, each from a list exported by its module:

* ``"capture"`` — Dynamo's torch-level graph, before AOTAutograd traces it (``attention.CAPTURE_PASSES``, run by
  ``aot.lower_with_aot``: the trace picks attention's kernel from what it sees);
* ``"wrapper"`` — the graph rebuilt around the generated kernels, the Python a compiled call runs
  (``wrapper_passes.WRAPPER_PASSES``, run by ``partition.build_compiled_graph``).

Every pass has an option, its name, on unless its ``default`` says otherwise. The stages read the options of the
compile in progress from :func:`current` (``Options.active()`` sets them, as ``c_runtime.use`` sets the renderer);
outside any compile (Phase 8's ``compile_graph`` called directly) each pass runs where its default is on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import torch.fx as fx

KINDS = ("inference", "forward", "backward")  # the aten graphs AOTAutograd hands a backend
STAGES = ("capture", "aten", "wrapper")  # where a pass runs: see the module's docstring


@dataclass(frozen=True)
class Pass:
    """One backend pass: ``run(gm, part)`` on every graph of its ``stage`` (of a kind in ``kinds``: aten graphs),
    when its option is on. ``part`` is the :class:`~fusion.compiler.report.PartReport` of an aten graph; None at the
    capture and wrapper stages (a wrapper pass keeps what it did in ``gm.meta[name]``)."""

    name: str  # the option's key
    run: Callable[[fx.GraphModule, object], None]
    kinds: tuple[str, ...] = KINDS
    default: bool = True  # on unless options={name: False}; an opt-in pass says default=False
    doc: str = ""
    requires: tuple[str, ...] = ()  # other switches it is pointless without (e.g. "codegen")
    unless: tuple[str, ...] = ()  # switches that turn its default off (e.g. "cudagraphs"); an explicit option wins
    stage: str = "aten"  # one of STAGES

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"pass {self.name!r}: stage {self.stage!r} is none of {STAGES}")


# The options of the compile in progress (an Options, or None outside one): set by Options.active()
_CURRENT: ContextVar[object | None] = ContextVar("fusion_compile_options", default=None)


def current():
    """The :class:`~fusion.compiler.passes.Options` of the compile in progress, or None."""
    return _CURRENT.get()


def enabled_passes(stage_passes: Sequence[Pass], options=None) -> list[Pass]:
    """Those of ``stage_passes`` that are on, in order: by ``options`` (default: :func:`current`); with none, by
    each pass's default."""
    opts = options if options is not None else current()
    if opts is None:
        return [p for p in stage_passes if p.default]
    return [p for p in stage_passes if opts.enabled.get(p.name, p.default)]


def run_stage(stage_passes: Sequence[Pass], gm: fx.GraphModule, part=None, options=None) -> None:
    """Run every pass of ``stage_passes`` that is on (:func:`enabled_passes`) on ``gm``, in order."""
    for p in enabled_passes(stage_passes, options):
        p.run(gm, part)
