"""Distributed training steps, traced to aten graphs in one process with the fake process group.

``torch.distributed``'s *fake* backend (``FakeStore`` + ``backend="fake"``) accepts every collective and moves no
data: one process can pretend to be rank 0 of a world of 2, 4 or 8, so a whole data-parallel step traces on a laptop.
The steps call ``torch.distributed._functional_collectives`` (funcol): each collective returns a new tensor, and the
trace shows it as two nodes, the collective (``_c10d_functional.all_reduce`` …, which *starts* it) and its
``wait_tensor`` (where the result is first needed). That split is what an overlap scheduler moves.

>>> gm = capture_step("dp", layers=2, dim=8, batch=4)
>>> sorted({short(n) for n in gm.graph.nodes if is_collective(n) or is_wait(n)})
['all_reduce', 'wait_tensor']
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

STEPS = ("dp", "fsdp", "tp")  # data parallel, FSDP-style (ZeRO-3), tensor-parallel MLP
c10d = torch.ops._c10d_functional
COLLECTIVES = {"all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor"}  # all_reduce_: in place


def short(node: fx.Node) -> str:
    """``all_reduce`` for ``_c10d_functional.all_reduce.default``, ``mm`` for ``aten.mm.default``."""
    t = node.target
    return t._schema.name.split("::")[-1] if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))


def is_collective(node: fx.Node) -> bool:
    """A funcol collective start: all_reduce (or its in-place all_reduce_), all_gather_into_tensor or
    reduce_scatter_tensor (any overload)."""
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and t.namespace == "_c10d_functional" and short(node) in COLLECTIVES


def is_wait(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is c10d.wait_tensor.default


def ensure_fake_group(world_size: int = 2, rank: int = 0) -> None:
    """Start the fake process group (one process, ``world_size`` pretend ranks), unless a group already exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        if dist.get_world_size() != world_size:
            raise RuntimeError(
                f"a process group of world size {dist.get_world_size()} already exists; this capture wants "
                f"{world_size}. Fix: capture with world_size={dist.get_world_size()}, or destroy_process_group() first"
            )
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)


def _group() -> object:
    import torch.distributed as dist

    return dist.group.WORLD


# ----------------------------------------------------------------------------------------------------------------------
# The steps. Each is a function of flat tensors (weights first, then the batch) returning new weights (or the output).


def _layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One MLP layer: GELU(x @ w) then a LayerNorm without affine, so regions have pointwise chains to fuse."""
    h = torch.nn.functional.gelu(x @ w)  # [B, D]
    return torch.nn.functional.layer_norm(h, h.shape[-1:])


def _loss(ws: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    for w in ws:
        x = _layer(x, w)
    return x.square().mean()


def dp_step(*flat: torch.Tensor, lr: float = 0.1) -> tuple[torch.Tensor, ...]:
    """Data parallel: every rank holds all weights; gradients are all-reduced (averaged), layer by layer."""
    import torch.distributed._functional_collectives as funcol

    *ws, x = flat
    ws = [w.detach().requires_grad_(True) for w in ws]  # differentiate with respect to this step's weights
    grads = torch.autograd.grad(_loss(ws, x), ws)
    world = torch.distributed.get_world_size()
    # Written the way a first try is written: backward first, then one all_reduce per gradient (last layer first,
    # the order backward produces them). Every wait sits right after its collective: nothing overlaps yet.
    reduced = [funcol.all_reduce(g, "sum", _group()) / world for g in reversed(grads)][::-1]
    return tuple(w - lr * g for w, g in zip(ws, reduced, strict=True))


def fsdp_step(*flat: torch.Tensor, lr: float = 0.1) -> tuple[torch.Tensor, ...]:
    """FSDP-style (ZeRO-3): each rank keeps a 1/n shard of every weight (rows), all-gathers a layer's weight just
    before the layer uses it, and reduce-scatters each full gradient back to shards."""
    import torch.distributed._functional_collectives as funcol

    gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor  # renamed in torch 2.12+
    scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
    *shards, x = flat
    full, h = [], x
    for s in shards:
        w = gather(s, 0, _group()).detach().requires_grad_(True)  # [D/n, D] -> [D, D]
        full.append(w)
        h = _layer(h, w)
    grads = torch.autograd.grad(h.square().mean(), full)
    world = torch.distributed.get_world_size()
    gshards = [scatter(g, "sum", 0, _group()) / world for g in reversed(grads)][::-1]
    return tuple(s - lr * g for s, g in zip(shards, gshards, strict=True))


def tp_step(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Tensor-parallel MLP blocks (Megatron): w1 split by columns, w2 by rows; one all_reduce per block joins the
    partial sums. Forward only. The next block needs the sum, so the collective is on the critical path."""
    import torch.distributed._functional_collectives as funcol

    *ws, x = flat
    for w1, w2 in zip(ws[0::2], ws[1::2], strict=True):
        partial = torch.nn.functional.gelu(x @ w1) @ w2  # [B, D/n] @ [D/n, D] -> [B, D], this rank's share
        x = funcol.all_reduce(partial, "sum", _group()) + x
    return (x,)


def step_inputs(kind: str, layers: int, dim: int, batch: int, world_size: int, seed: int = 0, rank: int = 0,
                dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> list[torch.Tensor]:  # fmt: skip
    """Real inputs for a step on one rank (weights from ``seed``, the batch from ``seed + rank``)."""
    if kind not in STEPS:
        raise ValueError(f"unknown step {kind!r}: use one of {STEPS}")
    if dim % world_size:
        raise ValueError(f"dim={dim} must divide by world_size={world_size} (weights are split across ranks)")
    gen = torch.Generator().manual_seed(seed)  # the same full weights on every rank
    full = [torch.randn(dim, dim, generator=gen) / dim**0.5 for _ in range(layers * (2 if kind == "tp" else 1))]
    if kind == "dp":
        ws = full
    elif kind == "fsdp":  # rank r keeps rows r·D/n … (r+1)·D/n of each weight
        ws = [w.chunk(world_size, dim=0)[rank].clone() for w in full]
    else:  # tp: w1 split by columns, w2 by rows
        ws = [w.chunk(world_size, dim=1 if i % 2 == 0 else 0)[rank].clone() for i, w in enumerate(full)]
    x = torch.randn(batch, dim, generator=torch.Generator().manual_seed(seed + 1 + rank))
    return [t.to(device=device, dtype=dtype) for t in [*ws, x]]


def step_shapes(kind: str, layers: int, dim: int, batch: int, world_size: int) -> list[tuple[int, int]]:
    """The shapes :func:`step_inputs` returns: this rank's weights (whole, or its shard), then the batch."""
    n = world_size
    weights = {"dp": [(dim, dim)] * layers, "fsdp": [(dim // n, dim)] * layers,
               "tp": [(dim, dim // n), (dim // n, dim)] * layers}[kind]  # fmt: skip
    return [*weights, (batch, dim)]


STEP_FUNCTIONS: dict[str, Callable[..., tuple]] = {"dp": dp_step, "fsdp": fsdp_step, "tp": tp_step}


def capture_step(kind: str = "dp", layers: int = 3, dim: int = 64, batch: int = 16, world_size: int = 2,
                 dtype: torch.dtype = torch.float32, decompose: bool = True, device: str = "cpu") -> fx.GraphModule:  # fmt: skip
    """The step ``kind`` ("dp", "fsdp", "tp") as an aten graph on fake tensors (``meta["val"]`` on every node).

    Starts the fake process group of ``world_size`` if none exists (a real group, e.g. gloo, is used as it is).
    ``decompose`` applies Inductor's decompositions (gelu, layer_norm → pointwise ops and reductions), as Phase 6.
    """
    if kind not in STEPS:
        raise ValueError(f"unknown step {kind!r}: use one of {STEPS}")
    ensure_fake_group(world_size)
    from torch._subclasses.fake_tensor import FakeTensorMode

    if dim % torch.distributed.get_world_size():
        raise ValueError(
            f"dim={dim} must divide by world_size={torch.distributed.get_world_size()} (weights are split)"
        )
    shapes = step_shapes(kind, layers, dim, batch, torch.distributed.get_world_size())
    with FakeTensorMode() as mode:  # shapes only: a 2 GB weight stack costs nothing to trace
        fake = [torch.empty(s, dtype=dtype, device=device) for s in shapes]
    gm = capture_fn(STEP_FUNCTIONS[kind], fake, decompose=decompose, mode=mode)
    gm.meta["step"] = dict(kind=kind, layers=layers, dim=dim, batch=batch, world_size=world_size)
    return gm


def capture_fn(fn: Callable[..., object], inputs: list[torch.Tensor], decompose: bool = True,
               mode: object = None) -> fx.GraphModule:  # fmt: skip
    """Any function of tensors that calls funcol collectives, traced on fake tensors (the fake group must exist,
    or a real one: :func:`ensure_fake_group`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion.aten.capture import decomposition_table

    if not torch.distributed.is_initialized():
        raise RuntimeError("no process group: call fusion.comms.capture.ensure_fake_group(world_size) first")
    if mode is None:  # real inputs: trace on fake copies of them
        mode = FakeTensorMode()
        inputs = [mode.from_tensor(t) for t in inputs]
    fake = inputs
    with mode:
        gm = make_fx(fn, decomposition_table=decomposition_table(decompose))(*fake)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
