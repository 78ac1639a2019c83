"""Inductor's accuracy rule for the model suite (``torch/_dynamo/utils.py``: ``same()``, ``rmse()`` and its
``get_multiplier()``, as ``benchmarks/dynamo/common.py`` calls it to mark a model ``pass`` or ``fail_accuracy``).

Every output tensor first gets ``allclose(eager, res, rtol=tol, atol=tol)``; failing that, the model is also run in
float64 and the backend passes when ``rmse(fp64, res) <= multiplier * rmse(fp64, eager) + tol / 10``: a compiled
model may be wrong only by a small multiple of what eager itself is wrong by in this dtype. ``multiplier`` is 3 for
bf16/fp16 outputs, 2 otherwise, 3 for tensors of fewer than 1000 elements, 1×1 maps or ``tol >= 2e-2``; with
``use_larger_multiplier_for_smaller_tensor`` (off by default, as in the runner) 10 at <= 10 elements and 8 below
1000. Integer and bool outputs must be equal; NaN matches NaN (the runner's ``equal_nan=True``).

This is the one rule: the model suite calls :func:`accuracy`, Phase 4's benchmark, the backend's lesson and the GPU
checks call :func:`acceptable` (the same rule, with a verdict and a line of text), and every table that prints "how
far from eager" prints :func:`relative_error` (max |Δ| / max |eager|), a measurement, not a verdict.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fusion.bench.counting import flat_tensors


@dataclass(frozen=True)
class Accuracy:
    ok: bool
    res_rmse: float | None = None  # the worst output's RMSE against float64 (None: allclose decided)
    eager_rmse: float | None = None  # eager's RMSE against float64 on that output
    multiplier: float | None = None
    reason: str = ""


def rmse(ref: torch.Tensor, res: torch.Tensor) -> float:
    return torch.sqrt(torch.mean(torch.square(ref.double() - res.double()))).item()


def multiplier_for(res: torch.Tensor, fp64: torch.Tensor, tol: float, larger_for_small: bool = False) -> float:
    m = 3.0 if res.dtype in (torch.float16, torch.bfloat16) else 2.0
    if larger_for_small and fp64.numel() <= 10:
        return 10.0
    if larger_for_small and fp64.numel() < 1000:
        return 8.0
    if fp64.numel() < 1000 or (res.ndim == 4 and res.shape[-1] == res.shape[-2] == 1) or tol >= 2e-2:
        return 3.0  # noise dominates small tensors (and 1x1 maps under reduced precision)
    return m


def tensor_accuracy(
    ref: torch.Tensor, res: torch.Tensor, fp64: torch.Tensor | None, tol: float, larger_for_small: bool = False
) -> Accuracy:
    """Inductor's rule for one output: ``ref`` is eager's, ``res`` the backend's, ``fp64`` eager in float64."""
    if ref.shape != res.shape or ref.dtype != res.dtype:
        return Accuracy(
            False, reason=f"shape/dtype {tuple(res.shape)}/{res.dtype}, eager {tuple(ref.shape)}/{ref.dtype}"
        )
    ref, res = ref.detach().cpu(), res.detach().cpu()
    if not ref.is_floating_point():
        return Accuracy(bool(torch.equal(ref, res)), reason="" if torch.equal(ref, res) else "integer outputs differ")
    if torch.allclose(ref, res, rtol=tol, atol=tol, equal_nan=True):
        return Accuracy(True)
    if fp64 is None or fp64.dtype != torch.float64:
        return Accuracy(False, reason=f"not allclose (tol {tol:g}) and no float64 reference")
    fp64 = fp64.detach().cpu()
    res_err, ref_err = rmse(fp64, res), rmse(fp64, ref)
    m = multiplier_for(res, fp64, tol, larger_for_small)
    ok = res_err <= m * ref_err + tol / 10 or (math.isnan(res_err) and math.isnan(ref_err))
    why = "" if ok else f"RMSE {res_err:.3g} vs float64 > {m:g} × eager's {ref_err:.3g} + {tol / 10:g}"
    return Accuracy(ok, res_err, ref_err, m, why)


def accuracy(ref: object, res: object, fp64: object, tol: float, larger_for_small: bool = False) -> Accuracy:
    """The rule over every output tensor; the verdict of the worst one (the first that fails)."""
    refs, ress, f64s = flat_tensors(ref), flat_tensors(res), flat_tensors(fp64)
    if len(refs) != len(ress):
        return Accuracy(False, reason=f"{len(ress)} output tensors, eager has {len(refs)}")
    worst = Accuracy(True)
    for i, (r, s) in enumerate(zip(refs, ress, strict=True)):
        a = tensor_accuracy(r, s, f64s[i] if i < len(f64s) else None, tol, larger_for_small)
        if not a.ok:
            return Accuracy(False, a.res_rmse, a.eager_rmse, a.multiplier, f"output {i}: {a.reason}")
        if a.res_rmse is not None and (worst.res_rmse is None or a.res_rmse > worst.res_rmse):
            worst = a
    return worst


def tolerance(dtype: torch.dtype) -> float:
    """``tol``: 1e-4 in float32 (the runner's default), 1e-2 under bf16/fp16 (our choice; the runner sets it per
    suite and model)."""
    return 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4


def max_diffs(got: object, want: object) -> tuple[float, float]:
    """(max |got - want| / max |want|, max |got - want|) over every output tensor, in float64 (inf, inf: the outputs
    do not pair up)."""
    rel, absolute = 0.0, 0.0
    gots, wants = flat_tensors(got), flat_tensors(want)
    if len(gots) != len(wants):
        return math.inf, math.inf
    for g, w in zip(gots, wants, strict=True):
        if not w.numel():
            continue
        w64 = w.detach().double()
        d = (g.detach().double() - w64).abs().max().item()
        rel, absolute = max(rel, d / (w64.abs().max().item() or 1.0)), max(absolute, d)
    return rel, absolute


def relative_error(got: object, want: object) -> float:
    """max |got - want| / max |want| over every output tensor: how far from eager, as the tables print it."""
    return max_diffs(got, want)[0]


def float64_of(model: torch.nn.Module, inputs: tuple) -> Callable[[], object]:
    """Eager in float64 for :func:`acceptable`'s second opinion: ``model`` copied (never the caller's) and run on the
    inputs cast to float64, the first time it is asked for, then kept; None where the model does not run in float64
    (then allclose alone decides)."""
    memo: list = []

    def fp64() -> object:
        if not memo:
            try:
                as64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
                with torch.no_grad():
                    memo.append(copy.deepcopy(model).double()(*as64))
            except Exception:  # noqa: BLE001 - an op without float64 (on this device): no second opinion
                memo.append(None)
        return memo[0]

    return fp64


def acceptable(
    got: object,
    want: object,
    fp64: object | Callable[[], object] | None = None,
    tol: float | None = None,
) -> tuple[bool, str]:
    """Is ``got`` (the backend's outputs) right, ``want`` being eager's? The rule of :func:`accuracy` at
    :func:`tolerance` of ``want``'s dtype (or ``tol``), and one line that says so: ``max |Δ| / max |eager| = 3.1e-06
    (ok)``, or ``... (TOO LARGE: <why>)``.

    ``fp64`` is eager in float64, or a function that computes it (called only when allclose is not enough, so that
    a float64 run is paid only for outputs that need it), or None: then allclose alone decides.
    """
    floats = [t for t in flat_tensors(want) if t.is_floating_point()]
    tol = tolerance(floats[0].dtype if floats else torch.float32) if tol is None else tol
    verdict = accuracy(want, got, None, tol)
    if not verdict.ok and fp64 is not None:
        verdict = accuracy(want, got, fp64() if callable(fp64) else fp64, tol)
    text = f"max |Δ| / max |eager| = {relative_error(got, want):.1e}"
    return verdict.ok, f"{text} ({'ok' if verdict.ok else 'TOO LARGE: ' + verdict.reason})"
