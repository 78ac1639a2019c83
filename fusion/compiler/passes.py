"""The backend's passes as data: an ordered list, each pass one function ``run(gm, part) -> None``.

A pass rewrites the aten graph in place and notes what it did in the :class:`~fusion.compiler.report.PartReport`
(``part.note_pass(name, nodes, action, why)``). Its name is its option: ``torch.compile(model, backend="fusion",
options={"fold_bn": False})`` switches the pass ``fold_bn`` off. Adding a pass is one function, one entry in the
driver's ``PASSES`` list (``fusion/compiler/driver.py``) and its test: :class:`Options` learns the name from the list. A pass written as ``f(gm,
note)`` (``note`` = ``part.note_pass``) enters as ``Pass("name", noted(f))``; an opt-in one says ``default=False``.

The passes of the two other stages (:mod:`fusion.compiler.pass_base`: Dynamo's graph before AOTAutograd, the
wrapper around the kernels) come in their modules' lists, :data:`STAGE_PASSES`; :class:`Options` knows their names
too, listed or not, and the stages read them while ``Options.active()`` (the compile in progress) holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch.fx as fx

from fusion.compiler.attention import CAPTURE_PASSES
from fusion.compiler.pass_base import _CURRENT, KINDS, Pass, current, enabled_passes, run_stage
from fusion.compiler.wrapper_passes import WRAPPER_PASSES
from fusion.kernels import c_runtime

__all__ = ["KINDS", "STAGE_PASSES", "Options", "Pass", "current", "enabled_passes", "noted", "run_stage"]

STAGE_PASSES = [*CAPTURE_PASSES, *WRAPPER_PASSES]  # the passes outside the aten stage, in their stages' order


class Options:
    """``options={...}`` of ``torch.compile(..., backend="fusion")``: one switch per pass, plus ``codegen``."""

    # Switches that are stages of the pipeline, not passes: codegen (regions -> generated Triton kernels) and
    # cudagraphs (replay each inference graph as one CUDA graph: fusion.compiler.cudagraphs; a no-op on a CPU);
    # min_cut (training: AOTAutograd's min-cut partitioner saves fewer activations and recomputes cheap pointwise ops
    # in the backward, as Inductor does; off: its default partitioner saves every value the backward reads). On by
    # default: measured faster on BERT, GPT-2 and Llama training steps, with less peak memory (H200, 2026-11-27,
    # scripts/results/h200-2026-11-27-min_cut/train.json). decompose_bn (training: batch norm decomposed into its
    # statistics and pointwise ops as Inductor does, not kept as the library's kernel; its output is then recomputed
    # in the backward, not saved: EfficientNet-B0's saved activations as Inductor's, 25.9 -> 18.0 MB at the CPU's
    # tiny sizes). Off: on an H200 (2026-11-29) EfficientNet-B0's step decomposed saved Inductor's bytes (peak 1.05x
    # Inductor's, kept 1.49x) but ran 0.72x as fast, with 18.6 ms more CPU a step (docs/measurements.md).
    STAGES = {"codegen": True, "cudagraphs": False, "min_cut": True, "decompose_bn": False}

    def __init__(self, passes: Sequence[Pass], options: Mapping[str, object] | None = None) -> None:
        listed = {p.name for p in passes}  # the stages' passes, where the driver's list does not name them
        self.passes = [*passes, *(p for p in STAGE_PASSES if p.name not in listed)]
        options = dict(options or {})
        self.explicit = frozenset(options)  # the switches the caller named: an explicit option beats any rule
        # Not a switch: which renderer runs CPU kernels, "c" or "triton" (None: $FUSION_RENDERER, else the default)
        self.renderer = options.pop("renderer", None)
        if self.renderer is not None:
            c_runtime.check_renderer(self.renderer, "options={'renderer': ...}")
        known = {p.name: p.default for p in self.passes} | self.STAGES
        unknown = set(options or {}) - set(known)
        if unknown:
            raise ValueError(f"unknown fusion backend option(s) {sorted(unknown)}; known: {list(known)}")
        self.enabled = {name: bool((options or {}).get(name, default)) for name, default in known.items()}
        for p in self.passes:  # a default that another switch turns off: depthwise under cudagraphs
            if p.name not in self.explicit and any(self.enabled[u] for u in p.unless):
                self.enabled[p.name] = False

    def __getattr__(self, name: str) -> bool:  # opts.fold_bn, opts.codegen
        enabled = self.__dict__.get("enabled", {})
        if name in enabled:
            return enabled[name]
        raise AttributeError(name)

    @contextlib.contextmanager
    def active(self) -> Iterator[Options]:
        """These are the options of the compile in progress inside this block (``pass_base.current()``): the capture
        and wrapper stages run the passes they switch on."""
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def in_renderer(self, generate: Callable, *args):
        """``generate(*args)`` (code generation) with this call's renderer of CPU kernels (``options["renderer"]``),
        these options active (the wrapper passes read them)."""
        with self.active(), c_runtime.use(self.renderer):
            return generate(*args)

    def passes_for(self, kind: str, stage: str = "aten") -> list[Pass]:
        """The passes to run on a graph of ``kind`` at ``stage`` (the aten graphs: the driver's loop), in list order."""
        return [
            p
            for p in self.passes
            if p.stage == stage
            and self.enabled[p.name]
            and kind in p.kinds
            and all(self.enabled[r] for r in p.requires)
        ]

    def describe(self) -> list[tuple[str, str, bool, str]]:
        """(name, stage, on, doc) per pass, in list order: what ``options={...}`` can switch."""
        return [(p.name, p.stage, self.enabled[p.name], p.doc) for p in self.passes]

    def __repr__(self) -> str:
        return f"Options({self.enabled})"


def noted(rewrite: Callable[[fx.GraphModule, Callable[..., None]], object]) -> Callable[[fx.GraphModule, object], None]:
    """A machinery rewrite ``rewrite(gm, note)`` as a pass ``run(gm, part)``: its decisions go to ``part.note_pass``."""

    def run(gm: fx.GraphModule, part) -> None:
        rewrite(gm, part.note_pass)

    run.__name__ = run.__qualname__ = getattr(rewrite, "__name__", "rewrite")
    return run
