"""The models of Phase 4's model suite: torchvision architectures and HuggingFace transformers built from configs
with random weights (nothing is downloaded), at three sizes: ``tiny`` (CPU, correctness, seconds), ``cpu`` (the CPU
suite of issue 38: the real vision architectures at batch 1×3×224×224, text models from small configs, d 256, 4 layers,
1×128 tokens) and ``full`` (the GPU shapes of issue 23: batch 32×3×224×224 for vision, 8×512 tokens for text).
Every model has a training row, ``<name>_train`` (issue 39), with no randomness: dropout and stochastic depth at 0.

Every builder returns a float32 CPU model and its CPU inputs; :mod:`fusion.bench.suite` moves them to the device and
dtype. A model whose package is not installed raises :class:`ModelSkipped` with the fix; the suite records the reason.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from fusion import models
from fusion.bench.counting import flat_tensors

SEED = 0
SIZES = ("tiny", "cpu", "full")
CPU_BATCH = 1  # the CPU suite's batch (vision and text)


class ModelSkipped(Exception):
    """This model cannot be built here (its package is missing); the message names the fix."""


@dataclass(frozen=True)
class SuiteModel:
    name: str  # the key on the command line and in the JSON
    title: str
    package: str  # "torchvision" | "transformers": the suite skips the model when it is missing
    build: Callable[[str], tuple[nn.Module, tuple[torch.Tensor, ...]]]  # sizes -> (fp32 CPU model, CPU inputs)
    train: bool = False  # a training step (forward, backward, optimizer) instead of inference
    image: bool = False  # an image model: channels_last on CUDA


def _need(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        extra = " (uv sync --extra models)" if package == "transformers" else ""
        raise ModelSkipped(f"{package} is not installed. Fix: install it{extra}")


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return make()


# ----------------------------------------------------------------------------------------------------------------------
# torchvision


def _vision_inputs(sizes: str, batch_stats: bool = False) -> tuple[torch.Tensor]:
    """``batch_stats``: a training step of a full-size architecture at ``tiny`` sizes, whose BatchNorms normalise over
    the batch: at 2×32×32 its last maps are 1×1 and each BatchNorm's statistics come from 2 values, a step so
    ill-conditioned that eager's own float32 gradients were 9-14× their largest off float64's (ResNet-50,
    EfficientNet-B0; a 1e-14 change of the input moved them by 1e-4). At 4×64×64 (2×2 maps, 16 values) they are
    within 2e-5 (EfficientNet-B0, ResNet-18) and 4e-3 (ResNet-50) of their largest, eager against float64."""
    tiny = (4, 64) if batch_stats else (2, 32)
    batch, size = {"full": (32, 224), "cpu": (CPU_BATCH, 224)}.get(sizes, tiny)
    return models.conv_inputs(batch, 3, size, seed=SEED + 1)  # x: (batch, 3, size, size)


def _deterministic_(model: nn.Module) -> None:
    """Dropout and stochastic depth off (p = 0), as the text models' configs set their dropout to 0: a training step
    is then a function of its inputs, and its loss and gradients compare with eager's. In eval mode both are the
    identity already; dropout's mask inside a kernel has its own tests and measurement (``scripts/gpu_random.py``)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0


def vision(arch: str, train: bool = False) -> Callable[[str], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    """``arch``'s builder; ``train``: for its training row (larger ``tiny`` inputs where the batch statistics need
    them: :func:`_vision_inputs`)."""

    def build(sizes: str):
        _need("torchvision")
        import torchvision

        tv = torchvision.models
        tiny = {  # each architecture's family at a tiny config (CPU tests): the same blocks, fewer and narrower
            "vit_b_16": lambda: tv.VisionTransformer(
                image_size=32, patch_size=16, num_layers=2, num_heads=4, hidden_dim=32, mlp_dim=64
            ),
            "swin_t": lambda: tv.SwinTransformer([4, 4], 16, [2, 2], [2, 4], [4, 4], stochastic_depth_prob=0.0),
            "maxvit_t": lambda: tv.MaxVit((32, 32), 8, 2, [16, 32], [1, 1], head_dim=8, stochastic_depth_prob=0.0),
            "densenet121": lambda: tv.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16),
        }
        if sizes == "tiny" and arch in tiny:
            make = tiny[arch]
        else:
            make = lambda: getattr(torchvision.models, arch)(weights=None)  # noqa: E731
        model = models.randomize_batchnorm_(_seeded(make).eval(), SEED)  # random BN statistics: folding is tested
        _deterministic_(model)
        if arch == "vit_b_16":  # torchvision zero-initialises ViT's head: every output would be 0, any answer right
            with torch.no_grad():
                g = torch.Generator().manual_seed(SEED + 2)
                model.heads.head.weight.copy_(0.02 * torch.randn(model.heads.head.weight.shape, generator=g))
        return model, _vision_inputs(sizes, train and arch not in tiny)

    return build


# ----------------------------------------------------------------------------------------------------------------------
# HuggingFace transformers, from configs (random weights, nothing downloaded)


class TensorOutputs(nn.Module):
    """A HuggingFace model called on token ids, its output (a ModelOutput) as a tuple of tensors."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:  # input_ids: (batch, seq)
        return tuple(flat_tensors(self.model(input_ids=input_ids).to_tuple()))


TINY_TEXT = dict(hidden=32, layers=2, heads=4, intermediate=64, vocab=128, positions=64)
CPU_TEXT = dict(hidden=256, layers=4, heads=4, intermediate=1024, vocab=8192, positions=512)  # sizes == "cpu"


def _small(sizes: str) -> dict:
    return CPU_TEXT if sizes == "cpu" else TINY_TEXT


def _text_inputs(sizes: str, vocab: int) -> tuple[torch.Tensor]:
    batch, seq = {"full": (8, 512), "cpu": (CPU_BATCH, 128)}.get(sizes, (2, 8))
    g = torch.Generator().manual_seed(SEED + 1)
    return (torch.randint(0, vocab, (batch, seq), generator=g),)


def _hf_config(config_cls: type, sizes: str, names: dict[str, str], common: dict, small: dict | None = None):
    """A HuggingFace config: its defaults (the published model) at ``full`` sizes, else :func:`_small`'s numbers
    under the config's own names (``names``: ours -> theirs) and ``small``'s extra fields; ``common`` on both."""
    if sizes == "full":
        return config_cls(**common)
    t = _small(sizes)
    return config_cls(**{theirs: t[ours] for ours, theirs in names.items()}, **(small or {}), **common)


def _bert_config(sizes: str):
    from transformers import BertConfig

    common = dict(attn_implementation="sdpa", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    names = dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads")
    names.update(intermediate="intermediate_size", vocab="vocab_size", positions="max_position_embeddings")
    return _hf_config(BertConfig, sizes, names, common)  # full: bert-base, d 768, 12 layers, 12 heads


def _gpt2_config(sizes: str):
    from transformers import GPT2Config

    common = dict(attn_implementation="sdpa", use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    names = dict(hidden="n_embd", layers="n_layer", heads="n_head", vocab="vocab_size", positions="n_positions")
    return _hf_config(GPT2Config, sizes, names, common, dict(bos_token_id=0, eos_token_id=0))  # full: gpt2 (124M)


def _llama_config(sizes: str):
    from transformers import LlamaConfig

    common = dict(attn_implementation="sdpa", use_cache=False)
    if sizes == "full":  # a small Llama: 8 layers, d 1024, 16 heads (8 key/value heads), SwiGLU 2816
        return LlamaConfig(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=8,
            vocab_size=32000,
            max_position_embeddings=2048,
            **common,
        )
    t = _small(sizes)
    return LlamaConfig(
        hidden_size=t["hidden"],
        intermediate_size=t["intermediate"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        num_key_value_heads=t["heads"] // 2,
        vocab_size=t["vocab"],
        max_position_embeddings=t["positions"],
        **common,
    )


def _t5_config(sizes: str):  # relative-position attention bias (T5's encoder)
    from transformers import T5Config

    if sizes == "full":  # t5-base's encoder: d 768, 12 layers, 12 heads
        return T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, dropout_rate=0.0)
    t = _small(sizes)
    return T5Config(
        d_model=t["hidden"], d_kv=8, d_ff=t["intermediate"], num_layers=t["layers"], num_heads=t["heads"],
        vocab_size=t["vocab"], dropout_rate=0.0, relative_attention_num_buckets=8,
    )  # fmt: skip


def _mistral_config(sizes: str):  # grouped-query attention with a sliding window
    from transformers import MistralConfig

    common = dict(attn_implementation="sdpa", use_cache=False)
    if sizes == "full":  # 8 layers, d 1024, 16 heads over 4 key/value heads, a 256-token window over 512 tokens
        return MistralConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, sliding_window=256, **common,
        )  # fmt: skip
    t = _small(sizes)
    return MistralConfig(
        hidden_size=t["hidden"], intermediate_size=t["intermediate"], num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"], num_key_value_heads=1, vocab_size=t["vocab"],
        max_position_embeddings=t["positions"], sliding_window=4, **common,
    )  # fmt: skip


def _opt_config(sizes: str):  # learned positions (OPT: an offset of 2 into its position table)
    from transformers import OPTConfig

    common = dict(attn_implementation="sdpa", use_cache=False, dropout=0.0, attention_dropout=0.0)
    if sizes == "full":  # opt-125m: d 768, 12 layers, 12 heads
        return OPTConfig(**common)
    t = _small(sizes)
    return OPTConfig(
        hidden_size=t["hidden"], num_hidden_layers=t["layers"], ffn_dim=t["intermediate"],
        num_attention_heads=t["heads"], vocab_size=t["vocab"], max_position_embeddings=t["positions"],
        word_embed_proj_dim=t["hidden"], **common,
    )  # fmt: skip


def _randomize_layernorm_(model: nn.Module) -> nn.Module:
    """Every LayerNorm's weight and bias random (seeded), not HuggingFace's initial 1 and 0. GPT-2's and OPT's outputs
    end in a LayerNorm: with weight 1 and bias 0 each token's output has mean exactly 0, so the training rows' loss
    (a mean) was 0 whatever the parameters, and every gradient above that LayerNorm was 0 in theory (rounding noise
    compared with rounding noise: the row checked nothing)."""
    g = torch.Generator().manual_seed(SEED + 3)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm) and m.weight is not None:
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)
    return model


def hf(model_class: str, make_config: Callable[[str], object]):
    def build(sizes: str):
        _need("transformers")
        import transformers

        config = make_config(sizes)
        model = _randomize_layernorm_(_seeded(lambda: getattr(transformers, model_class)(config)).eval())
        return TensorOutputs(model), _text_inputs(sizes, config.vocab_size)

    return build


# ----------------------------------------------------------------------------------------------------------------------
# The suite


VISION = (
    "resnet18",
    "resnet50",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "convnext_tiny",
    "vit_b_16",
    "swin_t",  # shifted-window attention
    "maxvit_t",  # block and grid attention
    "densenet121",  # dense concatenation
)
TEXT = (  # (name, transformers class, config)
    ("bert", "BertModel", _bert_config),
    ("gpt2", "GPT2Model", _gpt2_config),
    ("llama", "LlamaModel", _llama_config),
    ("t5_encoder", "T5EncoderModel", _t5_config),  # relative-position attention bias
    ("mistral", "MistralModel", _mistral_config),  # grouped-query attention with a sliding window
    ("opt", "OPTModel", _opt_config),  # learned positions
)
TEXT_TITLES = {
    "bert": "bert-base config",
    "gpt2": "gpt2 config",
    "llama": "8 layers, d 1024",
    "t5_encoder": "t5-base encoder",
    "mistral": "GQA, sliding window",
    "opt": "opt-125m config",
}

SUITE: tuple[SuiteModel, ...] = (
    *(SuiteModel(arch, f"torchvision {arch}", "torchvision", vision(arch), image=True) for arch in VISION),
    *(
        SuiteModel(name, f"HF {cls} ({TEXT_TITLES[name]})", "transformers", hf(cls, config))
        for name, cls, config in TEXT
    ),
    *(  # a training step of every model above (fp32 weights, bf16 autocast on CUDA, forward + backward + SGD)
        SuiteModel(f"{arch}_train", f"torchvision {arch}, training step", "torchvision", vision(arch, True), True, True)
        for arch in VISION
    ),
    *(
        SuiteModel(f"{name}_train", f"HF {cls}, training step", "transformers", hf(cls, config), True)
        for name, cls, config in TEXT
    ),
)
MODELS = {m.name: m for m in SUITE}


def scalar_loss(out: object) -> torch.Tensor:
    """The training steps' loss: the mean of every output tensor, summed (as Inductor's dashboard reduces outputs)."""
    return sum(
        (t if t.dtype == torch.float64 else t.float()).mean() for t in flat_tensors(out) if t.is_floating_point()
    )
