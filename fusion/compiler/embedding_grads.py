"""Pass ``embedding_grads`` (wrapper stage, opt-in): an embedding's weight gradient as a table of zeros and one
scatter-add, not ATen's ``embedding_dense_backward``.

A training graph keeps ``embedding_dense_backward`` whole (``fusion.aten.capture.TRAINING_KEEP``: our generated
float32 scatter-add was slower on the GPU). On CUDA, ATen's kernel for more than 3,072 indices sorts them (a radix
sort of the indices and their positions), finds each index's segment, sums the segments' rows into partial sums and
adds those into the table: about 15 launches and their temporary buffers. Under torch.profiler on an H200 host each
call took 356-368 µs of CPU (``scripts/results/h200-2026-11-28-2330-effnet/ops_t5_mistral_train.log``), in training
steps that are CPU-bound (T5: two a step, Mistral and Llama: one). Inductor decomposes the op into an accumulating
``index_put`` that it generates with atomic adds.

Here the call becomes :func:`embedding_grad`: ``zeros(num_weights, d)``, one ``index_add_`` of every gradient row
into its index's row (ATen's CUDA kernel adds with atomics: one launch), and the padding row zeroed as eager zeroes
it. Three calls where ATen makes about 15. Predicted on the H200: up to ~0.3 ms of CPU less a call (the profiler's
figures include its own overhead). Not measured on a GPU yet, so it stays off by default; the suite's
``fusion+with-embedding_grads`` is its A/B (``bash scripts/gpu_measure.sh embed``).

Values: each table row is the sum of the same gradient rows. Atomic adds take them in no fixed order, so the float32
rounding may differ from eager's, and from one call to the next. So the call keeps ATen's kernel while
``torch.use_deterministic_algorithms`` is on (checked each call). Refused, and kept as ATen's kernel, with the reason
in ``gm.meta["embedding_grads"]``:

* another device than CUDA (``ON_CPU``, for the tests, lifts that);
* ``scale_grad_by_freq`` (each row divided by its index's count);
* half types: eager sums them in float32, and atomic adds would sum in the half type;
* more than :data:`MAX_PER_ROW` indices a row on average (T5's relative-position bias: 262,144 positions into a
  table of 32 rows). Atomic adds on one address wait for each other, where the sort gathers a row's terms first.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from fusion.aten.nodes import bind_args
from fusion.fxutils.finish import relint

aten = torch.ops.aten

MAX_PER_ROW = 64  # indices per table row, on average, past which the sort's way wins (same-address atomics)
ON_CPU = False  # the tests rewrite CPU graphs too


def embedding_grad(grad: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int) -> torch.Tensor:
    """``embedding_dense_backward(grad, indices, num_weights, padding_idx, False)``: the table's gradient, ``grad``'s
    rows added into the rows ``indices`` name; the padding row (``padding_idx`` >= 0) zero."""
    if torch.are_deterministic_algorithms_enabled():  # atomics: no fixed order of the additions
        return aten.embedding_dense_backward.default(grad, indices, num_weights, padding_idx, False)
    d = grad.shape[-1]
    out = grad.new_zeros((num_weights, d))
    out.index_add_(0, indices.reshape(-1), grad.reshape(-1, d))
    if padding_idx >= 0:
        out[padding_idx] = 0
    return out


def refusal(node: fx.Node, args: dict | None = None) -> str | None:
    """Why ``node`` (an ``embedding_dense_backward``, its arguments ``args`` by schema name if bound already) stays
    ATen's kernel, or None when the pass rewrites it."""
    args = args if args is not None else bind_args(node)
    grad, indices, num_weights = args["grad_output"], args["indices"], args["num_weights"]
    g = grad.meta.get("val") if isinstance(grad, fx.Node) else None
    i = indices.meta.get("val") if isinstance(indices, fx.Node) else None
    if not isinstance(g, torch.Tensor) or not isinstance(i, torch.Tensor) or not isinstance(num_weights, int):
        return "operands without traced values, or a symbolic table size"
    if g.device.type != "cuda" and not ON_CPU:
        return f"on {g.device.type}: ATen's loop adds each row once, with no sort to save"
    if args["scale_grad_by_freq"]:
        return "scale_grad_by_freq: each row is divided by its index's count"
    if g.dtype not in (torch.float32, torch.float64):
        return f"a {g.dtype} gradient: eager sums it in float32, atomic adds would sum in {g.dtype}"
    if i.numel() > MAX_PER_ROW * max(num_weights, 1):
        return (
            f"{i.numel()} indices into {num_weights} rows: the sort's way, where atomic adds would wait for each other"
        )
    return None


def embedding_grads(gm: fx.GraphModule) -> list[str]:
    """Pass ``embedding_grads`` (above): each ``embedding_dense_backward`` it accepts calls :func:`embedding_grad`.
    Returns what it did, a line a node: ``name: rewritten`` or ``name: kept (why)``."""
    done, rewritten = [], False
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.embedding_dense_backward.default)):
        args = bind_args(node)
        if why := refusal(node, args):
            done.append(f"{node.name}: kept ({why})")
            continue
        node.target, node.kwargs = embedding_grad, {}
        node.args = (args["grad_output"], args["indices"], args["num_weights"], args["padding_idx"])
        done.append(f"{node.name}: rewritten")
        rewritten = True
    if rewritten:
        relint(gm)
    return done
