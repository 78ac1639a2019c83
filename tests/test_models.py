"""The shared demo models: deterministic, the right shapes, the structure each phase relies on."""

import pytest
import torch

from fusion import models

pytestmark = pytest.mark.phase1

CASES = [
    (models.TinyNet, models.tiny_inputs, (4, 8)),
    (models.MLP, models.mlp_inputs, (8, 10)),
    (models.FunctionalMLP, models.mlp_inputs, (8, 10)),
    (models.MatmulAddReLU, models.matmul_inputs, (8, 64)),
    (models.ConvBNNet, models.conv_inputs, (2, 10)),
    (models.TransformerMLP, models.transformer_inputs, (2, 8, 64)),
    (models.ElementwiseChain, models.elementwise_inputs, (8, 64)),
    (models.QKVAttention, models.attention_inputs, (2, 8, 32)),
    (models.InceptionBlock, models.inception_inputs, (2, 28, 8, 8)),
    (models.NormGELUResidual, models.norm_inputs, (2, 8, 64)),
    (models.DataDependentBlock, models.data_dependent_inputs, (4, 32)),
]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize(
    "cls, inputs",
    [(models.QKVProjections, models.qkv_inputs), (models.PointwiseSiblings, lambda: (torch.randn(3, 64),))],
    ids=["QKVProjections", "PointwiseSiblings"],
)
def test_multi_output_models_are_seeded(cls, inputs):
    x = inputs()
    torch.manual_seed(123)
    a = cls()
    torch.manual_seed(456)
    b = cls()
    torch.testing.assert_close(a(*x), b(*x), rtol=0, atol=0)
    assert not torch.equal(_first(cls(seed=7)(*x)), _first(a(*x)))


@pytest.mark.parametrize("cls, inputs, shape", CASES, ids=[c[0].__name__ for c in CASES])
def test_deterministic_and_shaped(cls, inputs, shape):
    torch.manual_seed(123)
    a = cls().eval()
    torch.manual_seed(456)  # the global RNG must not matter
    b = cls().eval()
    x = inputs()
    torch.testing.assert_close(a(*x), b(*x), rtol=0, atol=0)
    assert a(*x).shape == shape
    assert not torch.equal(cls(seed=7).eval()(*x), a(*x))  # the seed does matter


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    models.ConvBNNet()
    torch.testing.assert_close(torch.rand(3), expected)


def test_mlp_skip_linear_has_two_users():
    gm = torch.fx.symbolic_trace(models.MLP())
    skip = next(n for n in gm.graph.nodes if n.target == "skip")
    assert len(skip.users) == 2


def test_conv_net_has_the_advertised_convs_and_nontrivial_bn():
    m = models.ConvBNNet()
    assert m.stem[0].bias is None and m.conv1.bias is not None
    assert m.conv2.groups == m.conv2.in_channels == m.conv2.out_channels  # depthwise
    for bn in (m.stem[1], m.bn1, m.bn2):
        assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))


def test_matmul_add_relu_stacks():
    m = models.MatmulAddReLU(32, 64, 16)
    assert len(m.weights) == 2
    assert m(torch.randn(5, 32)).shape == (5, 16)
    with pytest.raises(ValueError):
        models.MatmulAddReLU(32)
