"""The records the compiler's stages hand each other: data, no behaviour beyond describing itself.

* :mod:`fusion.ir.plan` — between the stages: ``Region`` (Phase 6's group of nodes), ``Kernel`` (a generated
  kernel's name and source), ``KernelPlan`` (what a launch needs besides the tensors), ``Unsupported`` (a refusal
  with its reason and node), ``LaunchPlan`` (the launch as data alone: what the runtime holds).
* :mod:`fusion.ir.views` — how a launch returns each output of its region: a stored tensor, a strided view of one,
  or aten steps by name (recipes of frozen records, no ``fx.Node``).
* :mod:`fusion.ir.kernel_ir` — one fused kernel as pure data (buffers, loops, index expressions, loads, ops,
  reductions, stores): what the device-neutral lowering builds and every renderer renders.

This folder is the bottom layer: ``fusion.kernels`` (renderers, runtimes) reads it, ``fusion.compiler`` (the
pipeline) builds it; neither is imported from here (``tests/test_layout.py`` checks).
"""
