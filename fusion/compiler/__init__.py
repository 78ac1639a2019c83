"""The compiler's pipeline, each stage one module with one job and a named type handed on (Phases 6, 8 and 9).

* :mod:`fusion.compiler.driver` — the stages in order (``STAGES``: the README's "How a tensor flows" table), the
  pass list ``PASSES``, ``Options`` and ``fusion_backend``, the function Dynamo calls.
* :mod:`fusion.compiler.generate` — code generation: Phase 6's regions, each lowered to the kernel IR
  (:mod:`fusion.compiler.lowering`) and rendered (``fusion.kernels.triton_render``, ``c_render``), then the partition.
* :mod:`fusion.compiler.registry` — the one point through which the lessons hand over what the learner writes
  (Phase 6's ``build_fusion_regions``, Phase 8's ``triton_expr`` and ``split_index``, Phase 9's ``fold_bn``, ``compile_aten_graph`` and ``lower``, Phase 10's
  ``overlap_pass``; Phases 2, 3, 5 and 7's passes for Phase 4's benchmark).
* :mod:`fusion.ir.plan` — the types between stages: ``Region``, ``Kernel``, ``KernelPlan``, ``Unsupported``, and
  ``LaunchPlan``, which :mod:`fusion.compiler.launch_plans` makes from a ``KernelPlan`` for the runtime (data alone).
* :mod:`fusion.compiler.aot` — the AOTAutograd glue: lowering a Dynamo graph to aten (with
  ``fusion.aten.capture.decomposition_table``, the one table of Phases 6, 8 and 9), the boxed calling convention,
  re-decomposing a rewritten graph.
* :mod:`fusion.compiler.passes` — the backend's passes as data (``Pass``) and the options built from their names.
* :mod:`fusion.compiler.graph_passes` — aten-level clean-ups: CSE, constants folded at compile time, BatchNorm
  statistics updated in place, each op sunk to just before its first user.
* :mod:`fusion.compiler.fold_weights` — folded Conv+BatchNorm weights installed as graph inputs (computed from the
  live parameters, refreshed when they change): what Phase 9's ``fold_bn`` pass calls.
* :mod:`fusion.compiler.epilogue` — the cuDNN conv+bias(+add)+ReLU epilogue (``fusion.kernels.cudnn``'s one
  implementation), and a conv's bias moved into the next generated kernel.
* :mod:`fusion.compiler.attention` — pass ``attention_mask`` (stage "capture"): a boolean attention mask made additive.
* :mod:`fusion.compiler.wrapper_passes` — the passes of the graph around the kernels (stage "wrapper"): prims as
  aten, the max-pool as one aten call, library outputs checked against the traced layout, views as strides,
  library calls through torch's Python bindings (:mod:`fusion.compiler.bindings`).
* :mod:`fusion.compiler.layout` — pass ``channels_last``: a CPU graph's convolutions read channels-last images (oneDNN's
  layout) where their weights are light; :mod:`fusion.compiler.memory_plan` — wrapper pass ``reuse_buffers``: a
  kernel's output written over an input that dies there, where the kernel reads it only at the element it writes
  (CPU and CUDA: a lower peak), or on a CPU into a buffer the graph is done with.
* :mod:`fusion.compiler.split_reductions` — pass ``split_reductions``: a reduction with few long rows (or columns) as
  two, the first filling the GPU.
* :mod:`fusion.compiler.cast_views` — pass ``cast_views``: a cast after views as the views of a cast, so it joins
  the kernel computing its input.
* :mod:`fusion.compiler.scatter_passes` — pass ``stack_scatters``: a sum of scatters into zeros that tile a dim as one
  ``cat``; pass ``index_put_sums``: an accumulating ``index_put`` into a small table as one masked sum (CUDA).
* :mod:`fusion.compiler.gemm_passes` — GEMM rewrites: a bmm of one weight expanded over the batch as one mm, a GEMM
  copied head-major (MultiheadAttention's packed q, k, v) as one GEMM per head.
* :mod:`fusion.compiler.depthwise` — pass ``depthwise``: a depthwise convolution renamed ``fusion::depthwise_conv2d``,
  a window sum the generator computes inside the kernel around it (``fusion.compiler.lower_windows``).
* :mod:`fusion.compiler.random_ops` — pass ``random``: dropout's ``aten.rand``/``bernoulli`` as ``fusion::philox_rand``
  over one seeds draw per call, generated inside the kernel that reads it (Philox4x32-10, ``tl.rand``'s bits).
* :mod:`fusion.compiler.partition` — the cut-and-retry loop over regions and the graph rebuilt around the kernels;
  :mod:`fusion.compiler.compiled` — what it returns, the compiled graph and model at run time.
* :mod:`fusion.compiler.bindings` — library calls of a compiled graph through torch's Python bindings
  (``torch.convolution`` instead of the ``aten.convolution.default`` OpOverload: less CPU per call).
* :mod:`fusion.compiler.report` — what the backend did to each graph: regions, generated kernels, library calls,
  fallbacks with reasons, graph breaks, printed as tables.

The GPU rows (eager vs ``backend="fusion"`` vs ``backend="inductor"`` on ResNet-18/50 and a transformer block) are
Phase 4's workloads: ``python -m fusion.benchmark --device cuda --only e2e_resnet18,e2e_transformer,resnet50``.

Dependencies point from the lessons to here, never back: the lessons call the stages (Phase 8 re-exports
``compile_graph`` from :mod:`fusion.compiler.generate`; Phase 9's passes call the rewrites here) and register their functions in
:mod:`fusion.compiler.registry`, which is how the driver calls them; nothing here imports a lesson.
"""
