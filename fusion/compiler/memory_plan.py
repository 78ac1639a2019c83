"""Wrapper pass ``reuse_buffers``: a kernel's output written into a buffer the graph has finished with.

On a CPU every tensor a compiled graph allocates is a ``malloc``; a large one (past glibc's mmap threshold, or once
the heap is trimmed) is fresh memory from the kernel, and the first write to each of its 4 KiB pages is a page fault
(~1 us with the zeroing). MobileNetV2 at batch 1 took ~2,200 faults a call under ``backend="fusion"`` against
Inductor's ~120, and with the faults away (glibc told never to return memory) the two ran at the same speed
(2026-11-27, one thread). Inductor's wrapper reuses a freed buffer of the same size for a later one
(``allow_buffer_reuse``); this is that plan, done on the compiled graph's nodes:

* A *buffer* is the storage of a fresh tensor: a convolution's or GEMM's output, or a launch's output that is a
  tensor its kernel stored, returned as it is and read by no other output (:func:`stored_of`; a region's output
  reshaped is allocated in its returned shape, ``launch_plans.allocated_as_returned``).
  Every node that may alias it (views, ``reinterpret``, ``as_traced``, a launch's output whose recipe reads it, any
  op not known to return a fresh tensor) keeps it alive; it is *dead* after the last use of all of them. A buffer
  the graph returns (or an alias of one) is never reused, nor are the graph's inputs.
* Walking the graph in order, a generated kernel's output of at least :data:`REUSE_MIN` bytes takes a dead buffer of
  the same dtype and exactly its bytes, the most recently freed first, or, in place, an input that dies at that
  kernel and that the kernel reads only at the element it writes, before writing it. The
  launch then writes into it (``Launcher.donated``: the buffer is passed after the inputs and viewed with the output's
  strides); the buffer lives on as that output and can be reused again once it dies (not when the input written
  over dies: the memory is the output's from then on).

On CUDA the caching allocator already hands a freed block back without the driver, so only the in-place half runs
there (:data:`IN_PLACE_DEVICES`): an output written over its dying input is never alive beside it, which lowers the
peak where the caching allocator cannot (H200, 2026-11-28: ResNet-50's peak 150 -> 112 MB, ConvNeXt-T's 166 -> 111,
Inductor's both; T5's training and Llama's steps no slower). The values computed are the same; the peak memory is
at most the same (a buffer held a little longer replaces an allocation).
"""

from __future__ import annotations

import dataclasses
import operator
import os
from collections import Counter

import torch
import torch.fx as fx

from fusion.aten.nodes import as_traced
from fusion.compiler.bindings import BINDINGS
from fusion.fxutils.finish import relint
from fusion.ir import kernel_ir as ir
from fusion.ir.views import Take, extent, reads
from fusion.kernels import triton_runtime as rt

aten = torch.ops.aten
# Bytes: glibc's default mmap threshold; below it malloc reuses freed chunks itself. $FUSION_REUSE_MIN=0 plans every
# buffer (the fuzzer's small tensors then exercise the plan: FUSION_REUSE_MIN=0 uv run pytest tests/test_fuzz.py)
REUSE_MIN = int(os.environ.get("FUSION_REUSE_MIN", 128 * 1024))
# Library calls that return a new tensor (read their inputs, alias none of them), as aten ops and as the Python
# bindings pass python_bindings calls them through
FRESH_OPS = (aten.convolution.default, aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)
FRESH_LIBRARY = frozenset({*FRESH_OPS, *(BINDINGS[op] for op in FRESH_OPS if op in BINDINGS)})
DEVICES = ("cpu",)  # where the whole plan runs (scripts/gpu_ab_reuse_cuda.py measures it on CUDA too)
# Where its in-place half runs: on CUDA the caching allocator already hands a freed block back, but an output written
# over its dying input lowers the peak (the two are never alive at once). FUSION_IN_PLACE=cpu turns it off on CUDA
# (the GPU A/B of scripts/gpu_peak_memory.py)
IN_PLACE_DEVICES = tuple(os.environ.get("FUSION_IN_PLACE", "cpu,cuda").split(","))


def _launcher(node: fx.Node) -> rt.Launcher | None:
    return node.target if node.op == "call_function" and isinstance(node.target, rt.Launcher) else None


def stored_of(launcher: rt.Launcher) -> dict[int, int]:
    """Output index -> stored tensor index, for each output of the launch that is one stored tensor, whole, that no
    other output reads (``launch_plans.allocated_as_returned`` allocates a tensor returned reshaped in the shape it
    is returned in): fresh memory, the kernel's. Left out: an output that is a view of an input, a view of part of
    a stored tensor, or a stored tensor another output also reads (as a view, or through a chain of view ops)."""
    plan = launcher.owner.plan
    first = len(plan.inputs)
    uses = Counter(i for r in plan.results for i in reads(r))
    return {
        i: r.index - first
        for i, r in enumerate(plan.results)
        if isinstance(r, Take) and r.index >= first and uses[r.index] == 1
    }


def _fresh_output(node: fx.Node) -> bool:
    """``node`` takes an output of a launch that is fresh memory of the kernel's."""
    launch = node.args[0]
    lc = _launcher(launch) if isinstance(launch, fx.Node) else None
    return lc is not None and node.args[1] in stored_of(lc)


def _span(val: torch.Tensor) -> int:
    """Bytes of storage the tensor's elements reach (0 if empty)."""
    return extent(val.shape, val.stride()) * val.element_size()


def _root(node: fx.Node) -> bool:
    """Does ``node`` hold a fresh buffer (its own storage)?"""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem and _fresh_output(node):
        return True
    return node.target in FRESH_LIBRARY


def _aliases_through(node: fx.Node, user: fx.Node) -> list[fx.Node]:
    """The nodes by which ``user`` (a user of ``node``) may hand ``node``'s memory on: none for a library call that
    returns a new tensor; for a launch, the outputs whose recipe reads the argument ``node`` (a view of it, or a
    chain of view ops over it); any other op itself (it may return a view)."""
    if user.op == "call_function" and user.target in FRESH_LIBRARY:
        return []
    launcher = _launcher(user)
    if launcher is None:
        return [user]
    results, first = launcher.owner.plan.results, len(launcher.owner.plan.inputs)
    at = {p for p, a in enumerate(user.args[:first]) if a is node}
    out = []
    for item in user.users:
        r = results[item.args[1]] if item.target is operator.getitem else None
        if r is None or at.intersection(reads(r)):
            out.append(item)
    return out


def _fits(buffer: fx.Node, val: torch.Tensor) -> bool:
    """May an output like ``val`` be written into ``buffer`` (same dtype, exactly its bytes, and the buffer dense)?"""
    b = buffer.meta["val"]
    return b.dtype == val.dtype and _span(b) == _span(val) == b.untyped_storage().nbytes()


def _in_place(launcher: rt.Launcher, node: fx.Node, i: int, val: torch.Tensor, arg: fx.Node, group: set[fx.Node]):
    """(input name, output name) if stored output ``i`` (``val``) of the launch ``node`` may be written over its
    argument ``arg`` (a buffer that dies here), else None: ``arg`` is one argument of the launch (no alias of it
    another), like the output in dtype and bytes, and the kernel reads it only at the element it stores output ``i``
    at, every such read before that store in the kernel's order (a reduction's walks of a row: the sum's, then the
    store's), so each element is read before it is written, in every renderer; rows or tiles are disjoint."""
    k = launcher.owner.plan.ir
    args = [a for a in node.args if isinstance(a, fx.Node)]
    if k is None or args.count(arg) != 1 or len(group & set(args)) != 1 or not _fits(arg, val):
        return None
    ins, outs = [b for b in k.buffers if not b.output], [b for b in k.buffers if b.output]
    j = list(node.args).index(arg)
    if j >= len(ins) or i >= len(outs) or ins[j].dtype != outs[i].dtype:
        return None
    return (ins[j].name, outs[i].name) if writable_over(k, ins[j].name, outs[i].name) else None


def writable_over(k: ir.Kernel, source: str, target: str) -> bool:
    """May kernel ``k`` store buffer ``target`` into the memory of its input ``source``: one store of ``target``, and
    every load of ``source`` at that store's offset (not at an index the kernel computes) and before it in the
    kernel's order?"""
    order = k.statements()
    loads = [(n, s) for n, s in enumerate(order) if isinstance(s, ir.Load) and s.buffer == source]
    stores = [(n, s.offset) for n, s in enumerate(order) if isinstance(s, ir.Store) and s.buffer == target]
    return len(stores) == 1 and all(not s.indirect and s.offset == stores[0][1] and n < stores[0][0] for n, s in loads)


def reuse_buffers(gm: fx.GraphModule) -> int:
    """The plan above on the compiled graph ``gm``, in place; returns how many outputs reuse a buffer."""
    nodes = list(gm.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    roots = [n for n in nodes if _root(n)]
    vals = [n.meta.get("val") for n in roots]
    where = (*DEVICES, *IN_PLACE_DEVICES)
    if not vals or any(not isinstance(v, torch.Tensor) or v.device.type not in where for v in vals):
        return 0
    death: dict[fx.Node, int] = {}  # buffer root -> position of the last use of it or of any alias of it
    aliases: dict[fx.Node, set[fx.Node]] = {}  # buffer root -> the nodes that may alias it (itself included)
    for root in roots:
        last, todo, seen = pos[root], [root], {root}
        while todo:
            cur = todo.pop()
            for user in cur.users:
                if user.op == "output":
                    last = len(nodes)  # returned: never reused
                last = max(last, pos[user])
                for alias in _aliases_through(cur, user):
                    if alias not in seen:
                        seen.add(alias)
                        todo.append(alias)
        if last < len(nodes):
            death[root], aliases[root] = last, seen
    owner = {n: r for r in death for n in (r, *(u for u in r.users if u.target is as_traced))}  # its whole storage
    free: list[fx.Node] = []  # dead buffers not yet reused, in the order they died
    pending = sorted(death, key=death.get)
    taken = 0
    for node in nodes:
        while pending and death[pending[0]] < pos[node]:
            free.append(pending.pop(0))
        launcher = _launcher(node)
        stored = stored_of(launcher) if launcher is not None and not launcher.donated else {}
        if not stored:
            continue
        device = launcher.owner.plan.device.split(":")[0]
        reuse = device in DEVICES  # a dead buffer of the same size, as well as a dying input
        if not reuse and device not in IN_PLACE_DEVICES:
            continue
        outs = {stored[u.args[1]]: u for u in node.users if u.target is operator.getitem and u.args[1] in stored}
        given: list[tuple[int, fx.Node]] = []  # (stored output, the buffer it is written into)
        pairs: list[tuple[str, str]] = []  # (input, output) buffer names of the kernel that share memory
        for i, item in sorted(outs.items()):
            v = item.meta.get("val")  # the output as the graph sees it: stored tensor i, or all of it viewed
            if not isinstance(v, torch.Tensor) or _span(v) < REUSE_MIN:
                continue
            used = {b for _, b in given}
            here = [
                (a, r) for a in node.args if (r := owner.get(a)) is not None and death[r] == pos[node] and a not in used
            ]
            pair = next(((a, r, p) for a, r in here if (p := _in_place(launcher, node, i, v, a, aliases[r]))), None)
            if pair is not None:  # an input that dies here, read only where output i is written: in place
                given.append((i, pair[0]))
                pairs.append(pair[2])
                pending.remove(pair[1])  # its memory is output i's now: free when that output dies, not before
                continue
            match = next((b for b in reversed(free) if _fits(b, v)), None) if reuse else None
            if match is not None:
                free.remove(match)
                given.append((i, match))
        if given:
            launcher.donated = tuple(i for i, _ in given)
            node.args = (*node.args, *(b for _, b in given))
            if pairs:
                plan = launcher.owner.plan
                launcher.owner.plan = dataclasses.replace(plan, ir=dataclasses.replace(plan.ir, in_place=tuple(pairs)))
            taken += len(given)
    if taken:
        relint(gm)
    return taken
