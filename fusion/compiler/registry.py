"""The one point through which the lessons hand the machinery what the learner writes.

A lesson registers its functions when it is imported (``registry.register(8, compile_graph=compile_graph)`` at its
end); the machinery looks them up by name when it runs (``registry.get("compile_graph")``). So dependencies point from
the lessons to the machinery, never back: nothing under ``fusion/`` imports a lesson, statically or by name, and a
lesson not imported yet is one clear error naming the import that registers it.

:data:`PROVIDERS` is the whole contract: every name the machinery may ask for, and the phase whose lesson provides it.
An unsolved exercise is registered like a solved one; calling it raises its ``NotImplementedError("TODO(human) ...")``,
which the benchmark turns into a "not solved yet" row and the Dynamo backend raises as it is.
"""

from __future__ import annotations

from collections.abc import Callable

# name -> (phase, the lesson module whose import registers it)
PROVIDERS: dict[str, tuple[int, str]] = {
    "fuse_linear_relu": (2, "fusion.manual_fusion"),
    "fuse_matmul_add_relu": (3, "fusion.pattern_rewriter"),
    "fuse_conv_bn": (5, "fusion.conv_bn_fusion"),
    "fuse_horizontal": (7, "fusion.horizontal_fusion"),
    "build_fusion_regions": (6, "fusion.regions"),  # an aten graph -> its fusion regions (node -> region)
    "triton_expr": (8, "fusion.codegen"),  # an IR op's Triton expression (kernels/triton_render.LESSON_OPS)
    "split_index": (8, "fusion.codegen"),  # a flat index -> one index per loop (the Triton renderer's loop variables)
    "fold_bn": (9, "fusion.backend"),  # the pass fold_bn: run(gm, part)
    "compile_aten_graph": (9, "fusion.backend"),  # AOTAutograd's compiler for one aten graph
    "lower": (9, "fusion.backend"),  # Dynamo's graph -> AOTAutograd -> compile_aten_graph per aten graph
    "overlap_pass": (10, "fusion.overlap"),  # the pass overlap: (gm, note)
}

_functions: dict[str, Callable] = {}


class NotRegistered(LookupError):
    """The machinery asked for a function whose lesson was not imported (or does not register it)."""


def register(phase: int, **functions: Callable) -> None:
    """Phase ``phase``'s lesson provides ``functions`` (by their :data:`PROVIDERS` names). A re-imported lesson
    registers its new functions in place of the old ones."""
    for name, fn in functions.items():
        if name not in PROVIDERS:
            raise ValueError(f"registry.register: unknown name {name!r}; known: {sorted(PROVIDERS)}")
        want, module = PROVIDERS[name]
        if want != phase:
            raise ValueError(f"registry.register: {name} is Phase {want}'s ({module}), not Phase {phase}'s")
        if not callable(fn):
            raise TypeError(f"registry.register: {name} must be a function, got {type(fn).__name__}")
        _functions[name] = fn


def get(name: str) -> Callable:
    """The registered function ``name``, or :class:`NotRegistered` naming the import that registers it."""
    if name in _functions:
        return _functions[name]
    if name not in PROVIDERS:
        raise NotRegistered(f"no lesson provides {name!r}; known: {sorted(PROVIDERS)}")
    phase, module = PROVIDERS[name]
    raise NotRegistered(f"Phase {phase}'s {name} is not registered: import {module}")


def is_registered(name: str) -> bool:
    return name in _functions


def phase_of(name: str) -> int:
    return PROVIDERS[name][0]


def lazy(name: str) -> Callable:
    """A function calling the registered ``name`` when it is called (not when it is defined): for tables built at
    import, such as the driver's ``PASSES``, before the lesson that provides ``name`` is imported."""

    def call(*args, **kwargs):
        return get(name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call
