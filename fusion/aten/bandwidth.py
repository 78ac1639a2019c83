"""Memory bandwidth for the region cost model: a named accelerator profile, a number, or a copy measured here."""

from __future__ import annotations

import torch

# Memory bandwidth of a few accelerators (GB/s, vendor peak figures; 1 GB = 1e9 bytes). Real kernels reach 80–90 %.
BANDWIDTH_PROFILES_GBPS: dict[str, float] = {"H100": 3350.0, "H200": 4800.0, "A100": 2039.0}


def measure_bandwidth_gbps(device: str | torch.device | None = None, mbytes: int = 256) -> float:
    """Copy bandwidth of ``device`` (default: cuda if available, else cpu): read + write bytes / median copy time."""
    from torch.utils.benchmark import Timer

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    src = torch.empty(mbytes * 2**20 // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    timer = Timer("dst.copy_(src)", globals={"dst": dst, "src": src})
    seconds = timer.blocked_autorange(min_run_time=0.2).median
    return 2 * src.nbytes / seconds / 1e9


def bandwidth_gbps(profile: str | float = "H100") -> float:
    """GB/s for a profile name ("H100", "H200", "A100"), "measured" (a copy on this machine), or a number."""
    if isinstance(profile, (int, float)):
        return float(profile)
    if profile == "measured":
        return measure_bandwidth_gbps()
    try:
        return BANDWIDTH_PROFILES_GBPS[profile]
    except KeyError:
        raise ValueError(
            f"unknown bandwidth profile {profile!r}: use one of {sorted(BANDWIDTH_PROFILES_GBPS)}, 'measured', "
            "or a number in GB/s"
        ) from None
