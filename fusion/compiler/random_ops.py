"""Randomness inside generated kernels: dropout's mask computed in the kernel that uses it (Inductor's
``replace_random``, written for this compiler).

What AOTAutograd gives a training graph for ``nn.Dropout(p)`` (with ``fusion.aten.capture.decomposition_table``):
``rand = aten.rand.default(shape, dtype, device)``, ``gt = rand > p``, ``mul = gt * x * (1 / (1 - p))``; the
partitioner saves the boolean ``gt`` for the backward (``grad * gt * scale``), it never recomputes ``rand``. p = 0 and
p = 1 leave no ``rand`` at all (the decomposition returns ``x`` or zeros). ``nn.Dropout2d`` and ``nn.AlphaDropout``
give ``aten.bernoulli.p(empty(N, C, 1, 1), 1 - p)``: rewritten too, as ``philox_rand < p``.

Eager runs ``rand`` as a kernel of its own that writes 4 bytes per element, read back by the next kernel. The pass
:data:`RANDOM` rewrites every ``aten.rand`` / ``aten.rand_like`` of a graph into

* one ``aten.randint(2**63 - 1, [count], dtype=int64)`` per device and graph call (``seeds``): drawn from torch's
  default generator, so ``torch.manual_seed(s)`` makes a run reproducible and two calls draw different masks;
* per rand node ``fusion.philox_rand(seed_i, shape)`` with ``seed_i = reinterpret(seeds, (1,), (1,), i)`` (a view,
  no kernel; not fusible, so the kernel reads its seed at its own pointer and two dropouts of the same shape share
  one kernel source): element ``k`` (its position in the contiguous tensor) is
  ``uniform(philox4x32_10(key=seeds[i], counter=(k, 0, 0, 0))[0])``, bit for bit Triton's ``tl.rand(seed, k)``. Each
  rand node of a graph has its own seed ``seeds[i]``: two masks of one graph are independent streams. The op is
  tagged pointwise, so Phase 6's regions take it into the kernel around it (``lowering`` generates
  it: ``tl.rand`` in Triton, the same Philox in C); where no kernel takes it, its eager implementation here (the same
  Philox in torch int64 arithmetic) computes the same bits.

A float16/bfloat16 rand becomes the float32 rand followed by a cast (eager's rand of a half dtype is a float draw
rounded too). The uniform is Triton's: ``int32(bits)``, negative ones flipped (``~x``), times ``4.6566127342e-10``:
31 random bits in [0, 1), where eager's CPU rand has 24: the same distribution to within 2**-24.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from fusion.aten.nodes import reinterpret
from fusion.compiler import passes
from fusion.fxutils.finish import relint

aten = torch.ops.aten
RAND_OPS = (aten.rand.default, aten.rand_like.default)
BERNOULLI = aten.bernoulli.p  # Dropout1d/2d/3d, AlphaDropout: one draw per channel, bernoulli(empty, 1 - p)
EMPTY_OPS = (aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default)
SEED_HIGH = 2**63 - 1  # seeds are drawn in [0, 2**63 - 1), as Inductor's inductor_seeds
NAME = "fusion::philox_rand"

# Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), Triton's constants.
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57
ROUNDS = 10
SCALE = 4.6566127342e-10  # Triton's uint_to_uniform_float: the largest 2**31 - 1 times it stays below 1.0
M32 = 0xFFFFFFFF


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of ``a * b`` for uint32 ``a`` and a tensor of uint32 values held in int64: the product
    wraps around 2**64 in int64 (two's complement), which leaves both halves right."""
    p = b * a
    return (p >> 32) & M32, p & M32


def philox_bits(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """The first 32-bit word of Philox4x32-10 for key ``seed`` (an int64 0-d tensor: low word k0, high word k1) and
    counters ``(counter, 0, 0, 0)`` (``counter``: int64 tensor of values < 2**32), as int64 values in [0, 2**32)."""
    k0, k1 = seed & M32, (seed >> 32) & M32
    c0, c1 = counter & M32, torch.zeros_like(counter)
    c2, c3 = c1, c1
    for _ in range(ROUNDS):
        hi_b, lo_b = _mulhilo(ROUND_B, c2)
        hi_a, lo_a = _mulhilo(ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + KEY_A) & M32, (k1 + KEY_B) & M32
    return c0


def uniform(bits: torch.Tensor) -> torch.Tensor:
    """Triton's ``uint_to_uniform_float`` of 32-bit values (int64 in [0, 2**32)): float32 in [0, 1)."""
    x = torch.where(bits >= 2**31, bits - 2**32, bits)  # the bits as an int32
    x = torch.where(x < 0, -x - 1, x).to(torch.int32)  # ~x: [0, 2**31)
    return x.to(torch.float32) * torch.tensor(SCALE, dtype=torch.float32, device=bits.device)


def philox_rand_reference(seed: torch.Tensor, size) -> torch.Tensor:
    """``fusion.philox_rand``'s eager implementation (``seed``: one int64 element): the generated kernels' bits."""
    if seed.numel() != 1 or seed.dtype != torch.int64:
        raise ValueError(f"philox_rand takes one int64 seed, got {seed.dtype} {tuple(seed.shape)}")
    n = 1
    for s in size:
        n *= int(s)
    counter = torch.arange(n, dtype=torch.int64, device=seed.device)
    return uniform(philox_bits(seed.reshape(()), counter)).reshape(tuple(size))


def _register() -> None:
    ns = torch.ops.fusion if hasattr(torch.ops, "fusion") else None
    if ns is not None and hasattr(ns, "philox_rand"):
        return
    torch.library.define(NAME, "(Tensor seed, SymInt[] size) -> Tensor", tags=(torch.Tag.pointwise,))
    torch.library.impl("fusion::philox_rand", "CompositeExplicitAutograd")(philox_rand_reference)

    @torch.library.register_fake("fusion::philox_rand")
    def _fake(seed, size):
        return seed.new_empty(tuple(size), dtype=torch.float32)


_register()
philox_rand = torch.ops.fusion.philox_rand.default


def is_philox_rand(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(getattr(node.target, "_schema", None), "name", "") == NAME


def _fake_mode(vals):
    from torch._guards import detect_fake_mode

    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def _bernoulli_p(node: fx.Node) -> object:
    p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p", 0.5)
    return float(p) if isinstance(p, (int, float)) and not isinstance(p, bool) else p


def seed_random(gm: fx.GraphModule, note) -> int:
    """Rewrite every ``aten.rand``/``rand_like`` of ``gm`` (default generator, floating, contiguous) into
    ``fusion.philox_rand`` over one seeds tensor per device drawn per call, and every ``bernoulli.p(x, p)`` into
    ``philox_rand < p`` at ``x``'s dtype. Returns how many were rewritten."""
    graph = gm.graph
    by_device: dict[torch.device, list[fx.Node]] = {}
    for n in graph.nodes:
        if n.op != "call_function" or n.target not in (*RAND_OPS, BERNOULLI):
            continue
        val = n.meta.get("val")
        why = ""
        if not isinstance(val, torch.Tensor):
            why = "no meta['val'] (capture the graph on fake tensors)"
        elif n.kwargs.get("generator") is not None:
            why = "an explicit generator: its stream is the caller's"
        elif n.target is BERNOULLI and not (isinstance(p := _bernoulli_p(n), float) and 0 <= p <= 1):
            why = "bernoulli's p is not a number in [0, 1]"
        elif val.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            why = f"rand of {val.dtype}"
        elif not val.is_contiguous() or not all(type(s) is int for s in val.shape):
            why = "not a contiguous static shape"
        elif val.numel() >= 2**31:
            why = "2**31 elements or more (32-bit counters)"
        if why:
            note("random", [n.name], "skipped", why)
            continue
        by_device.setdefault(val.device, []).append(n)
    count = 0
    for device, rands in by_device.items():
        fake = _fake_mode([r.meta["val"] for r in rands])
        first = next(n for n in graph.nodes if n.op != "placeholder")
        with graph.inserting_before(first):
            seeds = graph.call_function(
                aten.randint.default, (SEED_HIGH, [len(rands)]), {"dtype": torch.int64, "device": device}
            )
        with fake:
            seeds.meta["val"] = torch.empty([len(rands)], dtype=torch.int64, device=device)
        picks = []
        with graph.inserting_after(seeds):  # each rand's seed: a view at the top, read by the kernel as an input
            for i in range(len(rands)):
                picks.append(graph.call_function(reinterpret, (seeds, (1,), (1,), i)))
                with fake:
                    picks[-1].meta["val"] = seeds.meta["val"].as_strided((1,), (1,), i)
        for r, seed in zip(rands, picks, strict=True):
            val = r.meta["val"]
            with graph.inserting_before(r):
                new = graph.call_function(philox_rand, (seed, list(val.shape)))
                with fake:
                    new.meta["val"] = philox_rand(seed.meta["val"], list(val.shape))
                    if r.target is BERNOULLI:  # 1 with probability p: u < p, as torch's decomposition of it
                        new = graph.call_function(aten.lt.Scalar, (new, _bernoulli_p(r)))
                        new.meta["val"] = torch.empty(val.shape, dtype=torch.bool, device=device)
                if val.dtype != new.meta["val"].dtype:  # a half rand: the float32 draw rounded, as eager's
                    new = graph.call_function(torch.ops.prims.convert_element_type.default, (new, val.dtype))
                    new.meta["val"] = val
            r.replace_all_uses_with(new)
            shape_of = r.args[0] if r.target is BERNOULLI else None  # bernoulli's input gives its shape alone
            graph.erase_node(r)
            if isinstance(shape_of, fx.Node) and not shape_of.users and shape_of.target in EMPTY_OPS:
                graph.erase_node(shape_of)
            count += 1
        note("random", [r.name for r in rands], "rewritten",
             f"{len(rands)} random op(s) -> philox_rand in the kernels that read them; one seeds draw per call on {device}")  # fmt: skip
    if count:
        relint(gm)
    return count


RANDOM = passes.Pass(
    "random",
    passes.noted(seed_random),
    doc="dropout's rand generated in the kernel that reads it (Philox from one seed draw per call)",
    requires=("codegen",),  # without kernels the torch Philox would run op by op: slower than aten's rand
)
