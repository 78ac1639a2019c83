"""Helpers the test files share (not a test file: no tests here)."""

from __future__ import annotations

import collections

import torch


class Fn(torch.nn.Module):
    """A function as a module: ``Fn(lambda x: x * 2)``, what the code generator and the backend compile."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def with_and_without_overlap(fn, args) -> tuple[list, list]:
    """``fn`` compiled by ``backend="fusion"`` without, then with ``options={"overlap": True}``: (the two outputs,
    the overlap pass's notes of each compile)."""
    from fusion import backend

    outs, notes = [], []
    for opts in ({}, {"overlap": True}):
        torch._dynamo.reset()
        backend.reset()
        outs.append(torch.compile(fn, backend="fusion", options=opts)(*args))
        notes.append([n for r in backend.reports for p in r.parts for n in p.passes if n[0] == "overlap"])
    return outs, notes


class MaskedAttention(torch.nn.Module):
    """``scaled_dot_product_attention`` with a boolean mask, then a pointwise op."""

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2.0


def spy_mask_rewrite(monkeypatch) -> list:
    """The boolean attention-mask rewrite (``fusion.compiler.attention``, a CUDA pass) switched on for CPU graphs too;
    returns the list that collects the masks it rewrites."""
    from fusion.compiler import attention

    monkeypatch.setattr(attention, "DEVICES", ("cpu", "cuda"))
    rewritten: list = []
    original = attention.fused_attention_masks
    monkeypatch.setattr(attention, "fused_attention_masks", lambda gm: rewritten.extend(original(gm)) or rewritten)
    return rewritten


def library_calls() -> collections.Counter:
    """The library calls (aten ops outside the generated kernels) of every graph the backend compiled since its last
    reset, added up by op."""
    from fusion.compiler import driver

    return sum((p.library_calls for r in driver.reports for p in r.parts), start=collections.Counter())
