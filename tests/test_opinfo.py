"""Phase 8's op table against PyTorch's OpInfo samples, as Inductor's test_torchinductor_opinfo.py does.

Every op the generator claims (``CLAIMED``: OpInfo name -> the dtypes it must generate) runs on OpInfo's sample
inputs through ``compile_regions`` and must equal eager; for each claimed dtype at least one sample must be generated
whole (no op of it cut out to aten). A sample the generator refuses is fine (it runs as aten, with a reason) as long
as the answer is right. Adding an op to the generator: its rule in the lowering to the kernel IR where the IR lacks it
(``fusion/compiler/lowering.py``), one table line per renderer (Phase 8's ``triton_expr`` in ``fusion/codegen.py``,
``fusion/kernels/c_ops.py``) plus one line here.

CI runs float32 and one other dtype per op, two samples each (~40 s on 2 cores); FUSION_OPINFO_FULL=1 runs every
claimed dtype and every sample. Kernels run with the renderer tests/conftest.py picks for the generator's tests (the C
renderer where a compiler is found; FUSION_TEST_RENDERER=triton for Triton's interpreter), and every one must have run
with it. Phase 8's op table in the interpreter: test_codegen.py's test_every_pointwise_op_in_the_interpreter.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from fusion.codegen import compile_regions
from fusion.kernels import c_runtime
from fusion.kernels import triton_runtime as rt

pytestmark = [
    pytest.mark.phase8,
    pytest.mark.skipif(not rt.triton_status()[0], reason="Triton is not installed"),
]

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
FLOAT = (F16, BF16, F32, F64)
INT = (torch.int32, torch.int64, torch.uint8)
ALL = FLOAT + INT + (torch.bool,)
CLAIMED: dict[tuple[str, str], tuple[torch.dtype, ...]] = {
    ("add", ""): ALL, ("sub", ""): FLOAT + INT, ("mul", ""): ALL, ("div", "no_rounding_mode"): FLOAT + INT,
    ("neg", ""): FLOAT + INT, ("abs", ""): FLOAT + INT, ("exp", ""): FLOAT, ("log", ""): FLOAT, ("sqrt", ""): FLOAT,
    ("rsqrt", ""): FLOAT, ("sigmoid", ""): FLOAT, ("erf", ""): FLOAT, ("tanh", ""): FLOAT, ("reciprocal", ""): FLOAT,
    ("nn.functional.relu", ""): FLOAT + INT, ("where", ""): ALL, ("maximum", ""): ALL, ("minimum", ""): ALL,
    ("eq", ""): ALL, ("ne", ""): ALL, ("lt", ""): FLOAT + INT, ("le", ""): FLOAT + INT, ("gt", ""): FLOAT + INT,
    ("ge", ""): FLOAT + INT, ("logical_not", ""): ALL, ("clamp", ""): FLOAT + INT, ("clamp_min", ""): FLOAT,
    ("clamp_max", ""): FLOAT, ("pow", ""): FLOAT, ("nn.functional.gelu", ""): FLOAT, ("nn.functional.silu", ""): FLOAT,
    ("nn.functional.hardtanh", ""): FLOAT, ("nn.functional.hardsigmoid", ""): FLOAT, ("sum", ""): FLOAT,
    ("mean", ""): FLOAT, ("amax", ""): FLOAT, ("amin", ""): FLOAT, ("var", ""): FLOAT, ("var_mean", ""): FLOAT,
    ("softmax", ""): FLOAT, ("sin", ""): FLOAT, ("cos", ""): FLOAT, ("bitwise_and", ""): INT + (torch.bool,),
    ("bitwise_or", ""): INT + (torch.bool,),
}  # fmt: skip
FULL = os.environ.get("FUSION_OPINFO_FULL") == "1"


def _op_db():
    pytest.importorskip("expecttest")  # torch.testing._internal imports it (a dev dependency)
    from torch.testing._internal.common_methods_invocations import op_db

    return {(op.name, op.variant_test_name): op for op in op_db}


def _cases():
    cases = []
    for key, dtypes in CLAIMED.items():
        if FULL:
            cases += [(key, d) for d in dtypes]
        else:  # float32 (or the first claimed), and one other chosen by the op's name (every dtype covered across ops)
            first = F32 if F32 in dtypes else dtypes[0]
            others = [d for d in dtypes if d != first]
            cases += [(key, first)] + ([(key, others[zlib.crc32(key[0].encode()) % len(others)])] if others else [])
    return cases


class Sample(torch.nn.Module):
    """op(sample) with every tensor argument first passed through maximum(t, t) (same values, same dtype): so the
    op has a producer in the region and is generated as part of a kernel (a lone op is no region)."""

    def __init__(self, op, sample) -> None:
        super().__init__()
        self.op, self.sample = op, sample

    def forward(self, *tensors):
        it = iter(torch.maximum(t, t) for t in tensors)
        first = next(it)
        args = [next(it) if isinstance(a, torch.Tensor) else a for a in self.sample.args]
        return self.op.op(first, *args, **self.sample.kwargs)


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("FUSION_STRICT", "1")  # fusion.common.strict_compiler


@pytest.fixture(scope="module")
def op_db():
    return _op_db()


@pytest.mark.parametrize("key, dtype", _cases(), ids=lambda v: ".".join(filter(None, v)) if isinstance(v, tuple) else str(v).removeprefix("torch."))  # fmt: skip
def test_op_matches_eager_on_opinfo_samples(op_db, key, dtype):
    op = op_db[key]
    assert dtype in op.supported_dtypes("cpu"), f"{key} claims {dtype}, which torch does not support"
    samples = [s for s in op.sample_inputs("cpu", dtype) if not s.kwargs.get("out")]
    samples = [s for s in samples if all(a.numel() < 4096 for a in [s.input, *s.args] if isinstance(a, torch.Tensor))]
    generated, reasons = 0, []
    if key[0] in SCALAR_FORM:  # the generator claims the scalar form only: clamp(x, -0.5, 0.5), pow(x, 3)
        samples = [_with_scalars(s, SCALAR_FORM[key[0]]) for s in samples]
    scalar_args = [s for s in samples if not any(isinstance(a, torch.Tensor) for a in s.args)][:1]
    for sample in samples if FULL else samples[:2] + scalar_args + samples[-1:]:
        tensors = [sample.input] + [a for a in sample.args if isinstance(a, torch.Tensor)]
        if not all(isinstance(t, torch.Tensor) for t in tensors) or any(t.is_complex() for t in tensors):
            continue
        model = Sample(op, sample)
        want = model(*tensors)
        compiled = compile_regions(model, tensors)
        got = compiled(*tensors)
        torch.testing.assert_close(got, want, equal_nan=True, atol=_atol(dtype), rtol=_rtol(dtype), check_stride=False)
        for d in compiled.report.skipped:
            assert "internal error" not in d.reason, d.reason
            reasons.append(d.reason)
        ran = {lch.owner.ran for lch in compiled.compiled.launchers}
        assert ran <= {"c" if c_runtime.chosen() == "c" else "triton-interpreter"}, (ran, compiled.report.table())
        generated += compiled.num_kernels > 0 and not compiled.report.skipped
    assert generated, f"{key} {dtype}: no sample generated whole; reasons: {reasons}"


SCALAR_FORM = {"clamp": (-0.5, 0.5), "clamp_min": (-0.5,), "clamp_max": (0.5,), "pow": (3,)}


def _with_scalars(sample, scalars):
    """The sample with its tensor arguments replaced by Python scalars (OpInfo draws tensor bounds and exponents)."""
    from torch.testing._internal.opinfo.core import SampleInput

    args = [scalars[i] if isinstance(a, torch.Tensor) else a for i, a in enumerate(sample.args)]
    return SampleInput(sample.input, args=tuple(args), kwargs=sample.kwargs)


def _atol(dtype):
    return {F16: 1e-2, BF16: 5e-2, F32: 1e-5, F64: 1e-7}.get(dtype, 0)


def _rtol(dtype):
    return {F16: 1e-2, BF16: 5e-2, F32: 1e-4, F64: 1e-7}.get(dtype, 0)
