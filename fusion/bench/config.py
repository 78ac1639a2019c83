"""What one run of Phase 4's benchmark is configured with: the sizes of every workload per device (:data:`SIZES`:
CUDA runs the issues' shapes in bfloat16, CPU float32 shapes that finish in seconds on two cores, ``tiny`` the
tests' toy shapes), and the :class:`Config` that picks them (device, sizes, torch.compile on or off, threads, seed,
which workloads, a time budget). The workloads built from them are ``fusion.bench.workloads``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SEED = 0

# ----------------------------------------------------------------------------------------------------------------------
# Sizes. CUDA runs the issues' shapes in bfloat16; CPU runs float32 shapes that finish in seconds on two cores.
# None: the workload is skipped under these sizes (the report says so).


@dataclass(frozen=True)
class Sizes:
    linear_memory: tuple[int, int, int]  # (M, K, N): x (M, K) @ W (K, N), small batch, large weights
    linear_compute: tuple[int, int, int]  # (M, K, N): large batch, modest weights
    matmul: tuple[int, tuple[int, ...]]  # (batch, dims) for MatmulAddReLU(*dims)
    conv: tuple[int, int, int, int]  # (batch, in_ch, width, size) for ConvBNNet
    elementwise: tuple[int, int]  # (rows, d) for ElementwiseChain(d)
    copy_numel: int  # elements of the bandwidth probe (a copy src -> dst)
    matmul_n: int  # n of the compute probe (an n×n @ n×n matmul)
    rounds: int  # interleaved rounds per workload
    min_run_time: float  # seconds of blocked_autorange per variant per round
    layernorm: tuple[int, int] | None = None  # (rows, d) for x + gelu(layer_norm(x))
    qkv_decode: tuple[int, int] | None = None  # (M, d): three Linear(d, d) reading one x (M, d), launch-bound
    qkv_prefill: tuple[int, int] | None = None  # (M, d): the same at a prefill batch
    resnet: tuple[int, int] | None = None  # (batch, image size) for torchvision's ResNet-50 / MobileNetV2
    resnet18: tuple[int, int] | None = None  # (batch, image size) for the end-to-end ResNet-18
    transformer: tuple[int, int, int, int] | None = None  # (batch, seq, d_model, heads): nn.TransformerEncoderLayer


_CUDA = dict(
    linear_memory=(64, 4096, 4096),
    linear_compute=(32768, 1024, 1024),
    matmul=(8192, (1024, 4096, 1024)),
    conv=(64, 3, 128, 56),
    elementwise=(8192, 4096),
    layernorm=(8192, 4096),
    qkv_decode=(32, 1024),
    qkv_prefill=(8192, 1024),
    resnet=(64, 224),
    resnet18=(64, 224),
    transformer=(32, 512, 1024, 16),
)
SIZES: dict[str, Sizes] = {
    "cuda": Sizes(**_CUDA, copy_numel=256 * 2**20, matmul_n=8192, rounds=5, min_run_time=0.2),  # 512 MiB copy
    "cuda-quick": Sizes(**_CUDA, copy_numel=128 * 2**20, matmul_n=8192, rounds=3, min_run_time=0.05),
    # CPU: the small-batch Linear is one row (a decode step: a matrix-vector product, ~0.5 FLOP/byte), so that it
    # sits below any CPU's ridge; the large-batch one sits far above it. The labels come from the measured roofline.
    "cpu": Sizes(
        linear_memory=(1, 2048, 2048),
        linear_compute=(2048, 512, 512),
        matmul=(1024, (512, 1024, 512)),
        conv=(8, 3, 32, 32),
        elementwise=(2048, 4096),
        layernorm=(2048, 1024),
        qkv_decode=(32, 1024),
        qkv_prefill=(2048, 1024),
        resnet=(2, 64),
        copy_numel=16 * 2**20,  # 64 MiB in float32 each side
        matmul_n=1024,
        rounds=5,
        min_run_time=0.2,
    ),
    "cpu-quick": Sizes(
        linear_memory=(1, 1024, 1024),
        linear_compute=(1024, 256, 256),
        matmul=(512, (256, 512, 256)),
        conv=(4, 3, 16, 32),
        elementwise=(1024, 1024),
        layernorm=(512, 1024),
        qkv_decode=(32, 512),
        qkv_prefill=(512, 512),
        copy_numel=8 * 2**20,
        matmul_n=512,
        rounds=3,
        min_run_time=0.05,
    ),
    # Toy shapes for the tests: the harness end to end in seconds. Its numbers mean nothing.
    "tiny": Sizes(
        linear_memory=(2, 32, 32),
        linear_compute=(64, 16, 16),
        matmul=(8, (16, 32, 16)),
        conv=(1, 3, 4, 8),
        elementwise=(4, 16),
        layernorm=(4, 32),
        qkv_decode=(2, 16),
        qkv_prefill=(16, 16),
        resnet=(1, 32),
        resnet18=(1, 32),
        transformer=(1, 8, 32, 4),
        copy_numel=2**16,
        matmul_n=64,
        rounds=2,
        min_run_time=0.002,
    ),
}


@dataclass(frozen=True)
class Config:
    device: str = "cpu"  # "cpu" | "cuda"
    sizes: str = "cpu"  # a key of SIZES
    compile: bool = True
    threads: int = 0  # 0: keep torch.get_num_threads()
    seed: int = SEED
    quick: bool = False
    only: tuple[str, ...] = ()  # workload keys to run (empty: all)
    budget_s: float = 0.0  # wall-clock budget: past half of it, 2 rounds per workload; past all of it, skip the rest

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device == "cuda" else torch.float32


def default_config(device: str | None = None, quick: bool = False, compile: bool = True) -> Config:
    """The sizes for ``device``; ``quick``: smaller, fewer rounds, no torch.compile, and on CPU one thread.

    One thread in ``--quick`` because CPU math libraries spin-wait for their sibling threads: on a shared or busy
    machine (CI, a laptop compiling something) two threads can run a small op a hundred times slower than one.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = device + ("-quick" if quick else "")
    threads = 1 if quick and device == "cpu" else 0
    return Config(device=device, sizes=sizes, compile=compile and not quick, threads=threads, quick=quick)
