"""The machinery behind Phase 9's ``torch.compile`` backend (``fusion.backend``) that a learner need not read.

* :mod:`fusion.compiler.aot` — the AOTAutograd glue: lowering a Dynamo graph to aten with Inductor's
  decompositions, the boxed calling convention, re-decomposing a rewritten graph, the uncompiled fallback.
* :mod:`fusion.compiler.aten_passes` — the aten-level rewrites the lesson drives: installing folded Conv+BatchNorm
  weights (computed from the live parameters, refreshed when they change), the cuDNN conv+bias(+add)+ReLU
  epilogue, and the conv bias moved into the next generated kernel.
* :mod:`fusion.compiler.report` — what the backend did to each graph: regions, generated kernels, library calls,
  fallbacks with reasons, graph breaks, printed as tables.

The GPU rows (eager vs ``backend="fusion"`` vs ``backend="inductor"`` on ResNet-18/50 and a transformer block) are
Phase 4's workloads: ``python -m fusion.benchmark --device cuda --only e2e_resnet18,e2e_transformer,resnet50``.

Dependencies point from the lesson to here, never back: the fold math (Phase 5) and the code generator (Phase 8)
are passed in by ``fusion.backend``.
"""
