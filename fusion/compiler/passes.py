"""The backend's passes as data: an ordered list, each pass one function ``run(gm, part) -> None``.

A pass rewrites the aten graph in place and notes what it did in the :class:`~fusion.compiler.report.PartReport`
(``part.note_pass(name, nodes, action, why)``). Its name is its option: ``torch.compile(model, backend="fusion",
options={"fold_bn": False})`` switches the pass ``fold_bn`` off. Adding a pass is one function, one entry in the
driver's ``PASSES`` list (``fusion/compiler/driver.py``) and its test: :class:`Options` learns the name from the
list. A pass written as ``f(gm, note)`` (``note`` = ``part.note_pass``) enters as ``Pass("name", noted(f),
default=False)``: opt-in, ``options={"name": True}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch.fx as fx

from fusion.kernels import c_runtime

KINDS = ("inference", "forward", "backward")  # the aten graphs AOTAutograd hands a backend


@dataclass(frozen=True)
class Pass:
    """One backend pass: ``run(gm, part)`` on every aten graph of a kind in ``kinds``, when its option is on."""

    name: str  # the option's key
    run: Callable[[fx.GraphModule, object], None]
    kinds: tuple[str, ...] = KINDS
    default: bool = True  # on unless options={name: False}; an opt-in pass says default=False
    doc: str = ""
    requires: tuple[str, ...] = ()  # other switches it is pointless without (e.g. "codegen")
    unless: tuple[str, ...] = ()  # switches that turn its default off (e.g. "cudagraphs"); an explicit option wins


class Options:
    """``options={...}`` of ``torch.compile(..., backend="fusion")``: one switch per pass, plus ``codegen``."""

    # Switches that are stages of the pipeline, not passes: codegen (regions -> generated Triton kernels) and
    # cudagraphs (replay each inference graph as one CUDA graph: fusion.compiler.cudagraphs; a no-op on a CPU).
    STAGES = {"codegen": True, "cudagraphs": False}

    def __init__(self, passes: Sequence[Pass], options: Mapping[str, object] | None = None) -> None:
        self.passes = list(passes)
        options = dict(options or {})
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
            if p.name not in (options or {}) and any(self.enabled[u] for u in p.unless):
                self.enabled[p.name] = False

    def __getattr__(self, name: str) -> bool:  # opts.fold_bn, opts.codegen
        enabled = self.__dict__.get("enabled", {})
        if name in enabled:
            return enabled[name]
        raise AttributeError(name)

    def in_renderer(self, generate: Callable, *args):
        """``generate(*args)`` (code generation) with this call's renderer of CPU kernels (``options["renderer"]``)."""
        with c_runtime.use(self.renderer):
            return generate(*args)

    def passes_for(self, kind: str) -> list[Pass]:
        """The passes to run on an aten graph of ``kind``, in list order."""
        return [
            p
            for p in self.passes
            if self.enabled[p.name] and kind in p.kinds and all(self.enabled[r] for r in p.requires)
        ]

    def __repr__(self) -> str:
        return f"Options({self.enabled})"


def noted(rewrite: Callable[[fx.GraphModule, Callable[..., None]], object]) -> Callable[[fx.GraphModule, object], None]:
    """A machinery rewrite ``rewrite(gm, note)`` as a pass ``run(gm, part)``: its decisions go to ``part.note_pass``."""

    def run(gm: fx.GraphModule, part) -> None:
        rewrite(gm, part.note_pass)

    run.__name__ = run.__qualname__ = getattr(rewrite, "__name__", "rewrite")
    return run
