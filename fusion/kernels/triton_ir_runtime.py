"""Triton kernels rendered from the kernel IR (``fusion.kernels.triton_render``), launched from data alone, and which
source a Triton kernel comes from.

* :class:`IRKernel` — a ``kernel_ir.Kernel`` rendered to Triton: its source, its launch facts (grid from the IR's
  loops and the block sizes), the compiled function (loaded as every generated kernel is, by source:
  ``triton_runtime.load_kernel``, handed in as ``load`` so this module imports no runtime), and a call on the IR's
  buffers in call order (inputs, then outputs), checked against their sizes, strides and dtypes.
* :func:`chosen` / :func:`use` — the source of a region's Triton kernel: ``"region"`` (Phase 8's writer over the fx
  region, ``fusion/codegen.py``) or ``"ir"`` (the kernel IR the lowering built, rendered here). The backend's
  ``options={"triton_source": ...}`` (:func:`use` around its code generation), else ``$FUSION_TRITON_SOURCE``, else
  :data:`DEFAULT` (``"region"``: Phase 8's tests check the learner's kernels, and the GPU comparison is not measured
  yet). ``"ir"`` applies to CUDA tensors and to CPU tensors whose renderer is Triton's interpreter
  (``c_runtime.chosen() == "triton"``); a region the lowering refuses keeps the region writer's kernel.
* :func:`lower_for` — at code generation: the plan's kernel IR (``plan.ir``, or ``plan.ir_refused``) where the IR
  source applies (the compiler hands in its lowering: this folder never imports it).
* :func:`kernel_for` — at a ``RegionKernel``'s construction: its :class:`IRKernel`, or None and why not;
  :func:`sources` — which source each kernel Triton ran came from (the report's column).
"""

from __future__ import annotations

import torch

from fusion.ir import kernel_ir as ir
from fusion.kernels import c_runtime
from fusion.kernels.setting import Setting
from fusion.kernels.triton_render import render

SOURCES = ("region", "ir")
DEFAULT = "region"
SOURCE = Setting("triton_source", "FUSION_TRITON_SOURCE", SOURCES, DEFAULT, "Triton source")


def check_source(name: object, where: str) -> str:
    return SOURCE.check(name, where)


def chosen() -> str:
    """The source of Triton kernels now: the backend's option, else $FUSION_TRITON_SOURCE, else :data:`DEFAULT`."""
    return SOURCE.get()


def use(source: str | None):
    """Kernels generated inside this block take their Triton source from ``source`` (None: leave the choice)."""
    return SOURCE.use(source)


def applies(plan) -> bool:
    """Does the IR source apply to ``plan`` now: ``"ir"`` chosen, and its tensors on a GPU or on the CPU with
    Triton's interpreter as the renderer (the C renderer runs CPU kernels from the same IR otherwise)?"""
    if chosen() != "ir":
        return False
    device = plan_device(plan)
    return device == "cuda" or (device in ("cpu", "") and c_runtime.chosen() == "triton")


def plan_device(plan) -> str:
    """The device type of a plan's tensors: a ``LaunchPlan`` names it (``"cuda:0"``), a ``KernelPlan`` (at code
    generation) holds fx nodes whose values carry it; "" for a kernel without tensors, "mixed" for several."""
    if isinstance(getattr(plan, "device", None), str):
        return plan.device.split(":")[0]
    devices = {n.meta["val"].device.type for n in (*plan.inputs, *plan.stored)}
    return devices.pop() if len(devices) == 1 else ("" if not devices else "mixed")


def needs_ir(plan) -> bool:
    """Does a renderer of the kernel IR run ``plan`` now: the C renderer (CPU tensors, renderer "c") or the IR's
    Triton source (:func:`applies`)?"""
    return (c_runtime.chosen() == "c" and plan_device(plan) in ("cpu", "")) or applies(plan)


def lower_for(plan, lower):
    """``plan`` with its kernel IR (``plan.ir = lower(plan)``, or ``plan.ir_refused``) where a renderer of the IR
    runs it (:func:`needs_ir`); ``lower`` is the compiler's ``lowering.lower_plan`` (this folder never imports it)."""
    if plan.ir is None and plan.ir_refused is None and needs_ir(plan):
        from fusion.ir.plan import Unsupported

        try:
            plan.ir = lower(plan)
        except Unsupported as e:
            plan.ir_refused = e
    return plan


class IRKernel:
    """A kernel IR rendered to Triton: ``kernel(*tensors)`` launches it on the IR's buffers in call order."""

    def __init__(self, kernel: ir.Kernel, load) -> None:
        self.kernel, self.name, self._load = kernel, kernel.name, load
        self.source, self.launch = render(kernel)
        self._fns: dict[bool, object] = {}

    @property
    def num_warps(self) -> int:
        return self.launch.num_warps

    def function(self, interpret: bool):
        """The ``@triton.jit`` function (Triton's interpreter for CPU tensors), loaded once per source."""
        fn = self._fns.get(interpret)
        if fn is None:
            fn = self._fns[interpret] = self._load(self.source, self.name, interpret=interpret)
        return fn

    def launch_config(self, device: torch.device) -> tuple[int, dict[str, int]]:
        return self.launch.launch_config(device.type == "cuda")

    def check(self, tensors) -> None:
        if len(tensors) != len(self.kernel.buffers):
            raise ValueError(f"{self.name} takes {len(self.kernel.buffers)} tensors, got {len(tensors)}")
        for b, t in zip(self.kernel.buffers, tensors, strict=True):
            got = (tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch."))
            strided = all(
                st == want for size, st, want in zip(b.sizes, t.stride(), b.strides, strict=False) if size > 1
            )
            if got[0] != b.sizes or got[2] != b.dtype or not strided:
                raise ValueError(f"{self.name}: {b.name} is {got}, the kernel was rendered for "
                                 f"{(b.sizes, b.strides, b.dtype)}")  # fmt: skip

    def __call__(self, *tensors: torch.Tensor) -> None:
        """Launch on ``tensors`` (the IR's buffers in call order: inputs, then the outputs it writes)."""
        self.check(tensors)
        device = tensors[0].device if tensors else torch.device("cpu")
        grid, constexprs = self.launch_config(device)
        if grid > 0:
            self.function(device.type != "cuda")[(grid,)](*tensors, num_warps=self.num_warps, **constexprs)


def kernel_for(plan, load) -> tuple[IRKernel | None, str]:
    """(the :class:`IRKernel` of ``plan``, "") where the IR source applies and the region was lowered, else (None,
    why the region writer's kernel runs). A render error is a renderer bug: raised in tests (``FUSION_STRICT``)."""
    if not applies(plan):
        return None, f"triton_source={chosen()!r}" if chosen() != "ir" else "the C renderer runs this kernel"
    if plan.ir is None:
        return None, f"not lowered to the kernel IR: {plan.ir_refused or 'the compiler did not lower it'}"
    try:
        return IRKernel(plan.ir, load), ""
    except Exception as e:  # noqa: BLE001 - the region writer's kernel runs; raised in tests
        from fusion.common import fallback_reason

        return None, "Triton renderer failed: " + fallback_reason(e, "the Triton renderer of the kernel IR")


def sources(launchers) -> dict[str, str]:
    """Kernel name -> the source of the Triton kernel that ran it (``"ir"``, or ``"region: <why not the IR>"``), for
    the kernels of ``launchers`` (a compiled graph's, a ``PartReport``'s) that Triton ran so far (not C's)."""
    out = {}
    for lch in launchers:
        owner = lch.owner
        if getattr(owner, "ran", "").startswith("triton"):
            out[lch.__name__] = "ir" if owner.triton_source == "ir" else f"region: {owner.ir_refused}"
    return out
