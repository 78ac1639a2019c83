"""The runtime: a generated kernel's source in, a launch out. Load, check, launch; nothing else.

* :func:`triton_status` — can this machine run Triton at all (installed? a GPU, or the CPU interpreter?).
* :func:`load_kernel` — write the source to a cache directory and import it: ``@triton.jit`` reads the function's
  source with ``inspect``, so a kernel must live in a real file (Inductor's ``PyCodeCache`` does the same). Kernels
  for CPU tensors are defined with ``TRITON_INTERPRET=1`` set (only while their module is imported), so they run in
  Triton's interpreter; kernels for CUDA tensors are compiled by Triton.
* :class:`RegionKernel` — one :class:`~fusion.compiler.ir.KernelPlan` as a module: check the inputs against what
  the source was specialised for, allocate the outputs, launch on the grid, rebuild escaping views.
  ``_launcher(inputs)`` returns the bare launch (a cached launcher or a CUDA graph would replace that closure).

The graph around the launches is built by ``fusion.compiler.partition``; GPU timings live in ``fusion.kernels.timing``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.fx as fx

from fusion.compiler.ir import GeneratedKernel, Kernel, KernelPlan

__all__ = ["GeneratedKernel", "Kernel", "KernelPlan", "RegionKernel", "ShapeMismatchError", "load_kernel"]
__all__ += ["cache_dir", "triton_status"]

# Kept for tests/test_codegen.py's fixture (monkeypatch.setattr(rt, "STRICT", True)); strictness itself is
# fusion.common.strict_compiler (FUSION_STRICT, pytest, practice workspaces).
STRICT = False

# ----------------------------------------------------------------------------------------------------------------------
# Is Triton here?


def triton_status() -> tuple[bool, str]:
    """(can we run generated kernels, why not / how). Never raises."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # macOS wheels, a torch build without Triton, a broken install
        return False, f"Triton is not installed here ({type(e).__name__}: {e}); the source can be printed, not run"
    how = "on the GPU" if torch.cuda.is_available() else "in Triton's CPU interpreter (TRITON_INTERPRET=1)"
    return True, f"Triton {triton.__version__} runs the kernels {how}"


@contextlib.contextmanager
def _interpret(on: bool):
    """TRITON_INTERPRET set (or cleared) while a kernel module is imported: ``@triton.jit`` reads it at definition."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def cache_dir() -> Path:
    """Where generated kernels are written: $FUSION_CACHE_DIR, else <tmp>/fusion_kernels_<user>."""
    root = os.environ.get("FUSION_CACHE_DIR")
    if not root:
        user = os.environ.get("USER") or os.environ.get("USERNAME") or str(os.getuid() if hasattr(os, "getuid") else 0)
        root = os.path.join(tempfile.gettempdir(), f"fusion_kernels_{user}")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


_LOADED: dict[tuple[str, bool], object] = {}


def load_kernel(source: str, name: str, *, interpret: bool) -> object:
    """Write ``source`` to ``<cache_dir>/<name>_<hash>.py``, import it, return its function ``name``.

    One module per (source, interpret): loading the same source twice returns the same (already compiled) kernel.
    """
    key = (source, interpret)
    if key in _LOADED:
        return _LOADED[key]
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)  # atomic: a parallel test worker never imports half a file
    module_name = f"fusion_kernels.{path.stem}{'_interp' if interpret else ''}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # inspect.getsource finds the file through the module
    with _interpret(interpret):
        spec.loader.exec_module(module)
    kernel = getattr(module, name)
    _LOADED[key] = kernel
    return kernel


# ----------------------------------------------------------------------------------------------------------------------
# One generated kernel and its launch


def _same_layout(t: torch.Tensor, stride: tuple[int, ...]) -> bool:
    """Strides differ only where they do not matter: a dimension of size 1 is never stepped along (its index is 0)."""
    return all(size == 1 or a == b for size, a, b in zip(t.shape, t.stride(), stride, strict=True))


class ShapeMismatchError(ValueError):
    """A compiled kernel was called with tensors of another shape/stride/dtype than it was generated for."""


class RegionKernel(torch.nn.Module):
    """One region = one launch. Called with the region's external inputs, returns its external outputs (a tuple)."""

    def __init__(self, plan: KernelPlan) -> None:
        super().__init__()
        self.plan = plan
        self._compiled: dict[bool, object] = {}
        # Decided once, not per call (the per-call Python is what a small kernel's wall time is made of).
        vals = [node.meta["val"] for node in plan.stored]
        self._out_specs = [(tuple(v.shape), tuple(v.stride()), v.dtype) for v in vals]
        self._configs: dict[str, tuple[int, dict[str, int]]] = {}  # device type -> (programs, constexprs)

    @property
    def kernel(self) -> GeneratedKernel:
        return self.plan.kernel

    def _function(self, interpret: bool):
        fn = self._compiled.get(interpret)
        if fn is None:
            fn = self._compiled[interpret] = load_kernel(self.kernel.source, self.kernel.name, interpret=interpret)
        return fn

    def _launcher(self, inputs: Sequence[torch.Tensor]) -> tuple[Callable[[], None], list[torch.Tensor]]:
        """Check the inputs, allocate the outputs; return (launch once, the outputs it writes)."""
        plan = self.plan
        for node, t, want in zip(plan.inputs, inputs, plan.input_meta, strict=True):
            if t.shape != want[0] or t.dtype != want[2] or (t.stride() != want[1] and not _same_layout(t, want[1])):
                raise ShapeMismatchError(
                    f"{self.kernel.name}: input {node.name} is {tuple(t.shape)} stride {tuple(t.stride())} {t.dtype}, "
                    f"but the kernel was generated for {want[0]} stride {want[1]} {want[2]}. Fix: compile again "
                    "with example inputs of the shapes (and memory layout) you call it with"
                )
        device = inputs[0].device if inputs else torch.device("cpu")
        outs = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, stride, dtype in self._out_specs
        ]
        fn = self._function(interpret=device.type != "cuda")
        config = self._configs.get(device.type)
        if config is None:
            config = self._configs[device.type] = plan.launch_config(device)
        grid, constexprs = config

        def launch() -> None:
            if grid > 0:
                fn[(grid,)](*inputs, *outs, num_warps=plan.num_warps, **constexprs)

        return launch, outs

    def forward(self, *inputs: torch.Tensor) -> tuple:
        launch, outs = self._launcher(inputs)
        launch()
        values: dict[fx.Node, object] = dict(zip(self.plan.stored, outs, strict=True))
        values.update(zip(self.plan.inputs, inputs, strict=True))
        return tuple(_rebuild(node, values) for node in self.plan.outputs)


def _rebuild(node: fx.Node, values: dict[fx.Node, object]) -> object:
    """An escaping view is not written by the kernel: apply the view op to the tensor it aliases, here in Python."""
    if node in values:
        return values[node]
    args = fx.node.map_arg(node.args, lambda n: _rebuild(n, values))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: _rebuild(n, values))
    values[node] = node.target(*args, **kwargs)
    return values[node]
