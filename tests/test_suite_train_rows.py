"""The model suite's training rows (issue 39: a training step for every model of the suite): each declared and
buildable, a tiny step that is a function of its inputs and well-conditioned enough to compare with eager, and one
real step of a new family through ``backend="fusion"``, its loss and gradients against eager's.

Every row on the CPU at tiny sizes through the backend: ``uv run python scripts/check_train_rows.py`` (minutes).
"""

from __future__ import annotations

import pytest
import torch

from fusion.bench import suite_models as SM

INFERENCE = [m.name for m in SM.SUITE if not m.train]


@pytest.mark.phase4
def test_every_suite_model_has_a_training_row():
    train = {m.name for m in SM.SUITE if m.train}
    assert len(INFERENCE) >= 16
    assert {f"{n}_train" for n in INFERENCE} == train, "a model of the suite without its training row, or the reverse"


@pytest.mark.phase4
@pytest.mark.parametrize("name", [n for n in INFERENCE if n not in ("resnet50", "convnext_tiny")])
def test_training_row_builds_as_its_model_and_is_deterministic(name):
    """Each row builds the same architecture as its inference row, with no randomness left in training mode
    (dropout and stochastic depth at p = 0): a step is a function of its inputs, so eager's answer is the answer.
    (ResNet-50 and ConvNeXt-T are left out here: 25-28M parameters to initialise, the same builder as ResNet-18.)"""
    row, infer = SM.MODELS[f"{name}_train"], SM.MODELS[name]
    assert row.train and not infer.train and row.image == infer.image and row.package == infer.package
    try:
        model, inputs = row.build("tiny")
    except SM.ModelSkipped as e:
        pytest.skip(str(e))
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            assert m.p == 0.0, f"{name}: {m} draws a random mask in a training step"
    model.train()
    if sum(p.numel() for p in model.parameters()) > 200_000:
        return  # a full-size architecture: built and checked, its forward is the next test's (one of them)
    torch.manual_seed(1)
    a = SM.flat_tensors(model(*inputs))
    torch.manual_seed(2)
    b = SM.flat_tensors(model(*inputs))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), "a training step draws random numbers"


def _step(model, inputs, dtype):
    model = model.to(dtype).train()
    loss = SM.scalar_loss(model(*[x.to(dtype) if x.is_floating_point() else x for x in inputs]))
    loss.backward()
    return [loss.detach(), *[p.grad for p in model.parameters()]]


@pytest.mark.phase4
def test_tiny_batchnorm_training_step_is_well_conditioned():
    """A full-size architecture's tiny training step normalises over batch statistics of enough values that float32
    is close to float64 (at 2x3x32x32 ResNet-18's last maps are 1x1, each BatchNorm's statistics 2 values, and eager's
    float32 gradients were 6 % of their largest off float64's; EfficientNet-B0's 14x): the accuracy rule compares
    the backend's error against eager's own, which must be small for the comparison to mean anything."""
    import copy

    try:
        model, inputs = SM.MODELS["resnet18_train"].build("tiny")
    except SM.ModelSkipped as e:
        pytest.skip(str(e))
    got = _step(copy.deepcopy(model), inputs, torch.float32)
    want = _step(model, inputs, torch.float64)
    scale = max(g.abs().max().item() for g in want[1:])
    worst = max((g.double() - w).abs().max().item() for g, w in zip(got[1:], want[1:], strict=True)) / scale
    assert worst < 1e-3, f"float32 gradients {worst:.2g} of their largest off float64's: ill-conditioned inputs"


@pytest.mark.phase4
@pytest.mark.parametrize("name", ["gpt2_train", "opt_train", "bert_train"])
def test_text_training_step_reaches_every_parameter(name):
    """Every parameter's gradient is above rounding noise, except attention's key biases (softmax ignores a shift
    that is the same for every key). A model whose output ends in a LayerNorm of weight 1 and bias 0 (GPT-2, OPT as
    HuggingFace initialises them) has outputs of mean exactly 0: the loss was constant and every gradient above
    that LayerNorm 0 in theory, so the row compared rounding noise with rounding noise."""
    try:
        model, inputs = SM.MODELS[name].build("tiny")
    except SM.ModelSkipped as e:
        pytest.skip(str(e))
    model.train()
    SM.scalar_loss(model(*inputs)).backward()
    grads = {n: p.grad.abs().max().item() for n, p in model.named_parameters()}
    scale = max(grads.values())
    noise = [n for n, g in grads.items() if g < 1e-6 * scale and not n.endswith(("key.bias", "k_proj.bias"))]
    assert not noise, f"{name}: gradients at rounding noise: {noise[:5]}"


@pytest.mark.phase9
def test_sliding_window_gqa_training_step_through_fusion_equals_eager():
    """Mistral's training row (grouped-query attention: the backward sums the repeated key/value heads; a sliding
    window in the attention mask) through ``backend="fusion"``: the loss and every gradient equal eager's. One of its
    two layers, to keep the test short (both: ``scripts/check_train_rows.py --models mistral_train``)."""
    from fusion import backend
    from fusion.bench import suite as S

    spec = SM.MODELS["mistral_train"]
    try:
        model, inputs = spec.build("tiny")
    except SM.ModelSkipped as e:
        pytest.skip(str(e))
    model.model.layers = model.model.layers[:1]  # TensorOutputs(MistralModel): its decoder layers
    cfg = S.SuiteConfig(device="cpu")
    torch.manual_seed(0)
    want = S._snapshot(S._runner(spec, model, inputs, cfg, "eager", torch.float32)())
    backend.reset()
    torch.manual_seed(0)
    got = S._snapshot(S._runner(spec, model, inputs, cfg, "fusion", torch.float32)())
    assert sum(len(r.kernels) for r in backend.reports) > 0 and not any(r.error for r in backend.reports)
    scale = max(w.abs().max().item() for w in want[1:])
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    for i, (g, w) in enumerate(zip(got[1:], want[1:], strict=True)):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5 * scale, msg=lambda m, i=i: f"gradient {i}: {m}")
