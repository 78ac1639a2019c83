"""What the profiling scripts share (``gpu_profile_models.py``, ``gpu_profile_cpu.py``, ``gpu_sync_check.py``): each
suite model's call or training step under each backend, compiled fresh, exactly as the suite runs it
(``fusion.bench.suite._runner``), and a synchronisation that is a no-op without a GPU."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from fusion import backend
from fusion.bench.suite import SuiteConfig, _runner
from fusion.bench.suite_models import MODELS


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def fresh_steps(names: Sequence[str], backends: Sequence[str], cfg: SuiteConfig) -> Iterator[tuple[str, str, object]]:
    """(model, backend, step) for every model and backend; the backend's reports and Dynamo's caches reset before
    each compile (a step's report is then ``backend.reports``)."""
    for name in names:
        spec = MODELS[name]
        model32, inputs32 = spec.build(cfg.sizes)
        for label in backends:
            backend.reset()
            torch._dynamo.reset()
            yield name, label, _runner(spec, model32, inputs32, cfg, label, cfg.dtype)
