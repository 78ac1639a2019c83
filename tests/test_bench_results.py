"""The one accuracy rule as the benchmark, the lesson and the scripts call it (``acceptable``), and the one JSON
saver (``save_json``) every result file is written by."""

import json
import math

import pytest
import torch

from fusion.bench.accuracy import acceptable, float64_of, max_diffs, relative_error
from fusion.bench.results import run_meta, save_json

pytestmark = pytest.mark.phase4


def test_acceptable_is_inductors_rule_with_a_line_of_text():
    want = torch.linspace(-2, 2, 4000)
    ok, text = acceptable(want + 1e-6, want)
    assert ok and text.startswith("max |Δ| / max |eager| = ") and text.endswith("(ok)")
    ok, text = acceptable(want + 1e-3, want)  # outside allclose at float32's 1e-4, no float64 to ask
    assert not ok and "TOO LARGE" in text and "no float64 reference" in text
    # eager is as wrong as the backend against float64: the second opinion passes it, asked only when needed
    exact = want.double() + 1e-3
    asked = []
    assert acceptable(want + 2e-3, want, lambda: asked.append(1) or exact)[0] and asked == [1]
    assert acceptable(want, want, lambda: asked.append(2) or exact)[0] and asked == [1]
    assert not acceptable(want + 0.1, want, exact)[0]
    # bfloat16 outputs get bfloat16's tolerance (1e-2), float32's would fail them
    b = want.bfloat16()
    assert acceptable(b + 0.005, b)[0] and not acceptable(b + 0.005, b, tol=1e-4)[0]


def test_float64_of_runs_a_copy_once_and_only_when_asked():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    fp64 = float64_of(model, (x,))
    assert model.weight.dtype == torch.float32  # nothing ran yet, and the caller's model stays float32
    want = fp64()
    assert want.dtype == torch.float64 and fp64() is want and model.weight.dtype == torch.float32
    torch.testing.assert_close(want, model.double()(x.double()))
    ok, text = acceptable(model.float()(x) + 1e-3, model(x), float64_of(model, (x,)))
    assert not ok and "RMSE" in text  # the second opinion was asked: the backend is far worse than eager
    assert float64_of(torch.nn.Embedding(4, 2), (torch.tensor([1]),))().dtype == torch.float64  # ids stay ids
    assert float64_of(torch.nn.Linear(3, 3), (x,))() is None  # it does not run: no second opinion


def test_relative_error_is_max_delta_over_max_eager():
    want, got = torch.tensor([1.0, -4.0]), torch.tensor([1.5, -4.0])
    assert relative_error(got, want) == pytest.approx(0.125)
    assert max_diffs((got, want), (want, want)) == (pytest.approx(0.125), pytest.approx(0.5))
    assert max_diffs([got], [want, want]) == (math.inf, math.inf)


def test_save_json_adds_the_same_meta_everywhere(tmp_path):
    path = tmp_path / "deeper" / "r.json"
    result = {"rows": [{"x": float("nan"), "y": math.inf}]}
    save_json(path, result, device="cpu")
    back = json.loads(path.read_text())
    assert set(run_meta("cpu")) <= set(back["meta"]) and back["meta"]["device"] == "cpu"
    assert back["meta"]["torch_version"] == torch.__version__ and math.isnan(back["rows"][0]["x"])
    assert result == {"rows": result["rows"]}  # the caller's dict is left as it is
    # a result's own meta wins, keeps its place, and names the device when none is passed
    save_json(path, {"schema": 2, "meta": {"device": "cpu", "date": "then", "threads": 3}, "rows": []})
    back = json.loads(path.read_text())
    assert list(back) == ["schema", "meta", "rows"] and back["meta"]["date"] == "then" and back["meta"]["threads"] == 3
    assert not (tmp_path / "deeper" / "r.json.tmp").exists()
