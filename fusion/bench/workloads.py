"""The workloads of Phase 4's benchmark and how each variant is built (their sizes per device: ``fusion.bench.config``).

Every workload is a float32 CPU model and its inputs (``build``) plus its variants: the unfused model (eager), the
course's passes (Phase 2/3/5's FX passes, Phase 7's horizontal fusion), Phase 8's generated Triton kernels, Phase
9's ``torch.compile(backend="fusion")``, and torch.compile (Inductor) beside them. A variant whose phase is not
written or not solved, or that cannot run on this device, is recorded with the reason (``VariantUnavailable``),
never a crash. The passes come from :mod:`fusion.compiler.registry` (the lessons register them when the Phase 4
lesson imports them), so the benchmark runs in a practice workspace at any stage.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from fusion import models
from fusion.bench.config import SIZES, Config, Sizes
from fusion.compiler import generate, registry
from fusion.kernels.cudnn import cudnn_epilogue_unavailable, fuse_conv_relu_epilogue

# ----------------------------------------------------------------------------------------------------------------------
# The course's passes, from the registry


class VariantUnavailable(Exception):
    """This variant cannot run here (its phase is not written or not solved yet, or it needs another device)."""


class WorkloadSkipped(Exception):
    """This whole workload does not run under this config (a CUDA-only model on CPU, torchvision missing, ...)."""


TRITON_INTERPRETER = "Triton interpreter: correctness only"  # the reason every CPU run of generated kernels gives


def lesson(name: str):
    """The lesson's function ``name`` (:mod:`fusion.compiler.registry`), or VariantUnavailable naming the import
    that registers it (the Phase 4 lesson imports the lessons it measures; machinery never imports a lesson)."""
    try:
        return registry.get(name)
    except registry.NotRegistered as e:
        raise VariantUnavailable(f"phase {registry.phase_of(name)} not available ({e})") from e


def call_pass(fn: Callable[..., object], phase: int, *args: object) -> object:
    """``fn(*args)``; an unsolved exercise (NotImplementedError 'TODO(human)...') becomes VariantUnavailable."""
    try:
        return fn(*args)
    except NotImplementedError as e:
        if str(e).startswith("TODO(human)"):
            raise VariantUnavailable(f"phase {phase} exercise not solved yet") from e
        raise


def fuse_linear_relu(model: nn.Module, inputs=None, config=None) -> nn.Module:
    return call_pass(lesson("fuse_linear_relu"), 2, model)


def fuse_matmul_add_relu(model: nn.Module, inputs=None, config=None) -> nn.Module:
    return call_pass(lesson("fuse_matmul_add_relu"), 3, model)


def fuse_conv_bn(model: nn.Module, inputs=None, config=None) -> nn.Module:
    return call_pass(lesson("fuse_conv_bn"), 5, model.eval())


def fuse_horizontal(model: nn.Module, inputs=None, config=None) -> nn.Module:
    """Phase 7, the outputs left as slices (views) of the merged output: no copies, as attention reads them."""
    fuse = lesson("fuse_horizontal")
    return call_pass(lambda m: fuse(m, clone_outputs=False), 7, model)


def cudnn_epilogue_after_fold(folded: nn.Module, inputs=None, config: Config | None = None) -> nn.Module:
    """Phase 5's folded model + ``fuse_conv_relu_epilogue``, on CUDA with cuDNN only."""
    config = config or Config()
    why = cudnn_epilogue_unavailable(config.device, config.dtype)
    if why:
        raise VariantUnavailable(why)
    return fuse_conv_relu_epilogue(folded)


def compile_regions(model: nn.Module, inputs: Sequence[torch.Tensor], config=None) -> nn.Module:
    """Phase 8: one generated kernel per fusion region (built for these inputs' shapes, dtype, device): the
    compiler's code generation with Phase 6's regions and Phase 8's expressions (both from the registry)."""
    for name in generate.LESSON_PARTS:
        lesson(name)
    return call_pass(generate.compile_regions, 8, model, tuple(inputs))


def compile_fusion_backend(model: nn.Module, inputs=None, config=None) -> Callable:
    """Phase 9: ``torch.compile(model, backend="fusion")``; importing fusion.backend registers the backend."""
    lesson("lower")  # Phase 9's lesson registers "fusion" with Dynamo when it registers lower
    return torch.compile(model, backend="fusion")


# ----------------------------------------------------------------------------------------------------------------------
# Models of this benchmark that fusion.models does not have


class AddcmulChain(nn.Module):
    """``relu(x*a + b)*c + x`` hand-fused into three kernels instead of five, with PyTorch's own fused ops.

    There is no FX pass for elementwise chains in phases 2/3/5 (a single generated kernel is what torch.compile —
    and Phase 8's code generator — are for), so this variant shows how far existing fused ops take you: ``addcmul``
    is ``input + t1 * t2`` in one pass.
    """

    def __init__(self, chain: models.ElementwiseChain):
        super().__init__()
        self.a, self.b, self.c = chain.a, chain.b, chain.c

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (..., d)
        h = torch.addcmul(self.b, x, self.a)  # b + x*a: one kernel instead of two
        h = torch.relu_(h)  # in place: h is ours
        return torch.addcmul(x, h, self.c)  # x + h*c: one kernel instead of two


def hand_fuse_chain(model: nn.Module, inputs=None, config=None) -> nn.Module:
    return AddcmulChain(copy.deepcopy(model))


def _seeded_build(make: Callable[[], nn.Module], seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def transformer_block(d: int, heads: int) -> nn.Module:
    """``nn.TransformerEncoderLayer`` in eval mode, with PyTorch's MHA fast path switched off (process-wide): under
    no_grad the fast path runs the whole layer as one opaque op (``_transformer_encoder_layer_fwd``), which eager, our
    backend and Inductor would all just call; off, every variant runs the layer's real ops."""
    torch.backends.mha.set_fastpath_enabled(False)
    return nn.TransformerEncoderLayer(d, heads, batch_first=True).eval()


def torchvision_model(name: str, seed: int) -> nn.Module:
    """A randomly initialised torchvision architecture in eval mode, BatchNorm statistics randomised (no weights
    can be downloaded; random BN statistics make folding a real test, not the identity)."""
    if importlib.util.find_spec("torchvision") is None:
        raise WorkloadSkipped("torchvision is not installed")
    import torchvision

    model = _seeded_build(lambda: getattr(torchvision.models, name)(weights=None), seed)
    return models.randomize_batchnorm_(model.eval(), seed)


def _linear_relu(k: int, n: int, seed: int) -> nn.Module:
    return _seeded_build(lambda: nn.Sequential(nn.Linear(k, n), nn.ReLU()), seed)


# ----------------------------------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class VariantSpec:
    """How to build one variant: ``build(model, inputs, config)`` returns a module or callable.

    ``stage="fp32"``: built from the float32 CPU model (or from variant ``on``'s float32 model), then moved to the
    device and dtype: FX passes, whose folding is more exact in float32. ``stage="device"``: built from the eager
    model already on the device with the device inputs: generated kernels and compilers, which specialise on them.
    """

    name: str
    label: str
    build: Callable[..., object]
    stage: str = "fp32"
    on: str | None = None
    triton: bool = False  # runs generated Triton kernels: on CPU that is the interpreter, correctness only
    cuda_only: str = ""  # the reason it runs on CUDA only


@dataclass
class Workload:
    key: str
    title: str  # what it is; never a bound label: "memory-/compute-bound" comes from the measured roofline
    shape: str
    build: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]  # float32, CPU, eval mode
    variants: tuple[VariantSpec, ...] = ()
    channels_last: bool = False
    compile_label: str = "torch.compile(eager)"
    skip: str = ""  # a reason not to run it under this config


FX_EPILOGUE = VariantSpec("fx_epilogue", "FX phase 5 + cuDNN epilogue", cudnn_epilogue_after_fold, on="fx")
CODEGEN = VariantSpec("codegen", "phase 8: generated kernels", compile_regions, stage="device", triton=True)
FUSION_BACKEND = VariantSpec(
    "fusion_backend",
    'phase 9: compile(backend="fusion")',
    compile_fusion_backend,
    stage="device",
    triton=True,
    cuda_only="end-to-end backend rows run on CUDA only (on CPU its kernels would run in the Triton interpreter)",
)


def workloads(config: Config) -> list[Workload]:
    s, seed = SIZES[config.sizes], config.seed
    (m1, k1, n1), (m2, k2, n2) = s.linear_memory, s.linear_compute
    mb, dims = s.matmul
    cb, cin, cw, cs = s.conv
    er, ed = s.elementwise
    cuda = config.device == "cuda"
    layout = ", channels_last" if cuda else ""
    mm_shape = " → ".join(map(str, dims))
    phase2 = VariantSpec("fx", "FX phase 2: FusedLinearReLU", fuse_linear_relu)
    out = [
        Workload(
            "linear_relu_memory",
            "Linear+ReLU, small batch",
            f"x {m1}×{k1} @ W {k1}×{n1}",
            lambda: (_linear_relu(k1, n1, seed), models.matmul_inputs(m1, k1, seed=seed + 1)),
            (phase2,),
        ),
        Workload(
            "linear_relu_compute",
            "Linear+ReLU, large batch",
            f"x {m2}×{k2} @ W {k2}×{n2}",
            lambda: (_linear_relu(k2, n2, seed), models.matmul_inputs(m2, k2, seed=seed + 1)),
            (phase2,),
        ),
        Workload(
            "matmul_add_relu",
            "relu(x@w+b), 2 layers",
            f"x {mb}×{dims[0]}, {mm_shape}",
            lambda: (models.MatmulAddReLU(*dims, seed=seed), models.matmul_inputs(mb, dims[0], seed=seed + 1)),
            (VariantSpec("fx", "FX phase 3: fused_matmul_add_relu", fuse_matmul_add_relu),),
        ),
        Workload(
            "conv_bn_relu",
            "Conv+BN+ReLU net",
            f"x {cb}×{cin}×{cs}×{cs}, width {cw}{layout}",
            lambda: (models.ConvBNNet(cin, cw, seed=seed).eval(), models.conv_inputs(cb, cin, cs, seed=seed + 1)),
            (VariantSpec("fx", "FX phase 5: Conv+BN folded", fuse_conv_bn), FX_EPILOGUE),
            channels_last=cuda,
        ),
        Workload(
            "elementwise_chain",
            "relu(x*a+b)*c + x",
            f"x {er}×{ed}",
            lambda: (models.ElementwiseChain(ed, seed=seed), models.elementwise_inputs(er, ed, seed=seed + 1)),
            (VariantSpec("fx", "hand-fused: addcmul, relu_, addcmul", hand_fuse_chain), CODEGEN),
        ),
    ]
    if s.layernorm:
        lr, ld = s.layernorm
        out.append(
            Workload(
                "layernorm_gelu_residual",
                "x + gelu(LayerNorm(x))",
                f"x {lr}×{ld}",
                lambda: (models.NormGELUResidual(ld, seed=seed), models.elementwise_inputs(lr, ld, seed=seed + 1)),
                (CODEGEN,),
            )
        )
    for key, mkd in (("qkv_decode", s.qkv_decode), ("qkv_prefill", s.qkv_prefill)):
        if mkd:
            m, d = mkd
            out.append(
                Workload(
                    key,
                    f"Q,K,V projections ({key.removeprefix('qkv_')})",
                    f"x {m}×{d} → 3 × Linear({d}, {d})",
                    lambda m=m, d=d: (models.QKVProjections(d, seed=seed), models.qkv_inputs(m, d, seed=seed + 1)),
                    (VariantSpec("fx", "FX phase 7: fuse_horizontal (outputs as views)", fuse_horizontal),),
                )
            )
    out += _real_models(config, s, layout)
    return [w for w in out if not config.only or w.key in config.only]


def _real_models(config: Config, s: Sizes, layout: str) -> list[Workload]:
    """torchvision's ResNet-50 and MobileNetV2 (Phases 5 and 9), the end-to-end ResNet-18 and transformer block."""
    seed, cuda = config.seed, config.device == "cuda"
    out = []
    fold = VariantSpec("fx", "FX phase 5: Conv+BN folded", fuse_conv_bn)
    for key, arch in (("resnet50", "resnet50"), ("mobilenet_v2", "mobilenet_v2")):
        batch, size = s.resnet or (1, 32)
        out.append(
            Workload(
                key,
                f"torchvision {arch}",
                f"x {batch}×3×{size}×{size}{layout}",
                lambda arch=arch, batch=batch, size=size: (
                    torchvision_model(arch, seed),
                    models.conv_inputs(batch, 3, size, seed=seed + 1),
                ),
                (fold, FX_EPILOGUE, FUSION_BACKEND),
                channels_last=cuda,
                skip=_real_model_skip(config, s, arch),
            )
        )
    batch, size = s.resnet18 or (1, 32)
    out.append(
        Workload(
            "e2e_resnet18",
            "torchvision resnet18, end to end",
            f"x {batch}×3×{size}×{size}{layout}",
            lambda: (torchvision_model("resnet18", seed), models.conv_inputs(batch, 3, size, seed=seed + 1)),
            (FUSION_BACKEND,),
            channels_last=cuda,
            compile_label="torch.compile (inductor)",
            skip="" if s.resnet18 else "end-to-end rows run on CUDA only (the Triton interpreter is for correctness)",
        )
    )
    b, t, d, heads = s.transformer or (1, 8, 32, 4)
    out.append(
        Workload(
            "e2e_transformer",
            "nn.TransformerEncoderLayer (MHA fast path off)",
            f"x {b}×{t}×{d}, {heads} heads",
            lambda: (
                _seeded_build(lambda: transformer_block(d, heads), seed),
                models.transformer_inputs(b, t, d, seed=seed + 1),
            ),
            (FUSION_BACKEND,),
            compile_label="torch.compile (inductor)",
            skip=""
            if s.transformer
            else "end-to-end rows run on CUDA only (the Triton interpreter is for correctness)",
        )
    )
    return out


def _real_model_skip(config: Config, s: Sizes, arch: str) -> str:
    if not s.resnet:
        return f"not run with sizes '{config.sizes}' (a real model: run without --quick)"
    if config.sizes == "tiny" and arch != "resnet50":
        return "not run with sizes 'tiny' (resnet50 checks the same steps)"
    return ""


def prepare(model: nn.Module, config: Config, channels_last: bool) -> nn.Module:
    """Device, dtype and layout for a float32 CPU model (fuse first, in float32: folding is more exact there)."""
    model = model.to(device=config.device, dtype=config.dtype).eval().requires_grad_(False)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    wrong = [
        n
        for n, t in (*model.named_parameters(), *model.named_buffers())
        if t.is_floating_point() and (t.dtype != config.dtype or t.device.type != config.device)
    ]
    if wrong:
        raise RuntimeError(f"{type(model).__name__}: {wrong[:3]} did not move to {config.device}/{config.dtype}")
    return model


def prepare_inputs(inputs: Sequence[torch.Tensor], config: Config, channels_last: bool) -> tuple[torch.Tensor, ...]:
    out = []
    for x in inputs:
        x = x.to(device=config.device, dtype=config.dtype)
        if channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        out.append(x)
    return tuple(out)
