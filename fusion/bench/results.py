"""One way to write a result file: every measurement's JSON (Phase 4's benchmark, the model suite, the scripts under
``scripts/``) is written by :func:`save_json`, so every file says the same things about where it was measured, under
the same keys (:func:`run_meta`: device, card or CPU, torch, CUDA, Python, platform, date), and reads back the same
way (``indent=1``; NaN and infinity kept, as ``json`` writes them; written whole or not at all). A CPU measurement
adds :func:`cpu_meta`: the CPU's model and cores, torch's threads, the renderer and compiler."""

from __future__ import annotations

import datetime
import json
import os
import platform

import torch

from fusion.bench.profile import device_name


def run_meta(device: str | None = None) -> dict:
    """Where and when a measurement ran. ``device``: "cuda" or "cpu" (None: CUDA when there is a GPU)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return {
        "device": device,
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def save_json(path: str | os.PathLike, result: dict, device: str | None = None) -> None:
    """Write ``result`` to ``path``: its ``meta`` gets every key of :func:`run_meta` it lacks (its own win), the
    folder is made, and the file is replaced in one step (a reader never sees half a file). ``result`` itself is left
    as it is."""
    mine = result.get("meta", {})
    meta = {**run_meta(device or mine.get("device")), **mine}
    out = {k: meta if k == "meta" else v for k, v in result.items()} if "meta" in result else {"meta": meta, **result}
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, allow_nan=True)
        f.write("\n")
    os.replace(tmp, path)


def fusion_timed(device: str) -> bool:
    """Whether ``fusion``'s kernels on ``device`` are compiled code worth timing: always on CUDA; on CPU where the C
    renderer runs them (it is chosen and a compiler is found), not where Triton's interpreter would."""
    if device == "cuda":
        return True
    from fusion.kernels import c_runtime

    return c_runtime.chosen() == "c" and c_runtime.available()[0]


def cpu_meta() -> dict:
    """What a CPU measurement depends on: the CPU's model, its cores, torch's threads, the renderer and compiler."""
    from fusion.kernels import c_runtime

    name = next((ln.split(":", 1)[1].strip() for ln in _cpuinfo() if ln.startswith("model name")), platform.processor())
    ok, compiler = c_runtime.available()
    return {
        "cpu_model": name or platform.machine(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "fusion_renderer": c_runtime.chosen(),
        "fusion_timed": fusion_timed("cpu"),
        "c_compiler": compiler if ok else None,
    }


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read().splitlines()
    except OSError:
        return []
