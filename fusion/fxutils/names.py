"""Names for what a pass adds to a GraphModule, and keys for grouping nodes by their arguments."""

from __future__ import annotations

import torch.fx as fx


def fresh_name(gm: fx.GraphModule, base: str) -> str:
    """``base``, or ``base_1``, ``base_2``, ... : the first that names no attribute yet (dotted: under its parent)."""
    parent, _, leaf = base.rpartition(".")
    owner, name, i = gm.get_submodule(parent), leaf, 1
    while hasattr(owner, name):
        name, i = f"{leaf}_{i}", i + 1
    return f"{parent}.{name}" if parent else name


def merged_module_name(gm: fx.GraphModule, targets: list[str]) -> str:
    """'attn.q_k_v' for attn.q, attn.k, attn.v: under the common parent, the siblings' names joined by '_'."""
    parts = [t.split(".") for t in targets]
    common = 0
    while all(len(p) > common + 1 and p[common] == parts[0][common] for p in parts):
        common += 1
    leaf = "_".join("_".join(p[common:]) for p in parts)
    leaf = leaf if len(leaf) <= 40 else "horizontal"
    return fresh_name(gm, ".".join([*parts[0][:common], leaf]))


def hashable_key(value: object) -> object:
    """A hashable stand-in for a node's ``args``/``kwargs``: equal for equal arguments (nodes compare by identity)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(hashable_key, value))
    if isinstance(value, dict):
        return ("dict", *((k, hashable_key(v)) for k, v in sorted(value.items())))
    if isinstance(value, slice):
        return ("slice", hashable_key(value.start), hashable_key(value.stop), hashable_key(value.step))
    try:
        hash(value)
        return value
    except TypeError:
        return ("id", id(value))  # unhashable constant: equal only to itself
