"""Where the aten-level rewrites live now (this module only re-exports them, for the importers not yet moved):

* :mod:`fusion.compiler.fold_weights` — :class:`FoldSpec`, :class:`FoldedWeights`, :func:`install_folds` (pass
  ``fold_bn``: folded Conv+BatchNorm weights computed from the live parameters);
* :mod:`fusion.compiler.epilogue` — :func:`install_epilogues` (pass ``epilogue``: conv+bias(+add)+ReLU in cuDNN, whose
  calls :func:`cudnn_conv_bias_relu` / :func:`cudnn_conv_bias_add_relu` live in :mod:`fusion.kernels.cudnn`) and
  :func:`split_conv_bias` (pass ``conv_bias``);
* :mod:`fusion.compiler.graph_passes` — :func:`eliminate_common_subexpressions` (``cse``), :func:`fold_constants`
  (``constants``), :func:`reinplace_buffer_updates` (``reinplace``), :func:`reorder_for_locality` (``reorder``:
  :func:`sink_to_first_use`, :func:`hoist_constants`).

Import from those modules; this one goes once nothing imports it.
"""

from __future__ import annotations

from fusion.compiler.epilogue import epilogue_problem, install_epilogues, split_conv_bias
from fusion.compiler.fold_weights import FoldedWeights, FoldSpec, install_folds
from fusion.compiler.graph_passes import (
    FOLD_LIMIT_BYTES,
    eliminate_common_subexpressions,
    fold_constants,
    hoist_constants,
    reinplace_buffer_updates,
    reorder_for_locality,
    sink_to_first_use,
)
from fusion.kernels.cudnn import cudnn_conv_bias_add_relu, cudnn_conv_bias_relu

__all__ = [
    "FOLD_LIMIT_BYTES",
    "FoldSpec",
    "FoldedWeights",
    "cudnn_conv_bias_add_relu",
    "cudnn_conv_bias_relu",
    "eliminate_common_subexpressions",
    "epilogue_problem",
    "fold_constants",
    "hoist_constants",
    "install_epilogues",
    "install_folds",
    "reinplace_buffer_updates",
    "reorder_for_locality",
    "sink_to_first_use",
    "split_conv_bias",
]
