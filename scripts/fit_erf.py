"""The coefficients of the C renderer's float32 erf (``fusion_erff`` in fusion/kernels/c_prelude.py), fitted here.

    python3 scripts/fit_erf.py

Below |x| = 1: erf(x) / x - 1 as a polynomial q in z = x^2 of degree 6; above: erfc(a) exp(a^2) as t g(t) with
t = 1 / (1 + a / 2) and g of degree 6 on [1, 4] (a relative error of 6e-9 in erfc: at most 1e-9 of erf there). Each is
a least-squares fit of the relative error on Chebyshev nodes (numpy, float64 against math.erf / math.erfc); the script
prints the coefficients (highest degree first, as the C code's Horner steps take them) and each fit's largest relative
error on a dense grid. The float32 function built from them is within 1.5 ulp of the float64 erf (1.26 where the CPU
fuses multiply-adds, 1.40 where not; tests/test_c_renderer.py checks it).
"""

from __future__ import annotations

import math

import numpy as np

T_SCALE = 0.5


def _nodes(lo: float, hi: float, n: int = 4000) -> np.ndarray:
    return (np.cos(np.linspace(0, np.pi, n)) * 0.5 + 0.5) * (hi - lo) + lo


def _small_target(z: np.ndarray) -> np.ndarray:
    x = np.sqrt(z)
    return np.array([math.erf(v) / v if v > 0 else 2 / math.sqrt(math.pi) for v in x])


def _big_target(a: np.ndarray) -> np.ndarray:
    return np.array([math.erfc(v) * math.exp(v * v) for v in a])


def fit_small(degree: int = 6) -> tuple[np.ndarray, float]:
    """(coefficients of q, lowest degree first: erf(x) = x + x q(x^2) on |x| < 1, largest relative error)."""
    z = _nodes(0.0, 1.0)
    y = _small_target(z)
    c, *_ = np.linalg.lstsq(np.vander(z, degree + 1, increasing=True) / y[:, None], np.ones_like(y), rcond=None)
    grid = np.linspace(0.0, 1.0, 20001)
    rel = float(np.abs(np.polyval(c[::-1], grid) / _small_target(grid) - 1).max())
    c = c.copy()
    c[0] -= 1.0  # q = erf(x) / x - 1: the leading x is added exactly
    return c, rel


def fit_big(degree: int = 6) -> tuple[np.ndarray, float]:
    """(coefficients of g, lowest degree first: erfc(a) = exp(-a^2) t g(t) on [1, 4], largest relative error)."""
    a = _nodes(1.0, 4.0)
    t = 1 / (1 + T_SCALE * a)
    g = _big_target(a)
    basis = t[:, None] * np.vander(t, degree + 1, increasing=True)
    c, *_ = np.linalg.lstsq(basis / g[:, None], np.ones_like(g), rcond=None)
    grid = np.linspace(1.0, 4.0, 20001)
    tg = 1 / (1 + T_SCALE * grid)
    rel = float(np.abs(tg * np.polyval(c[::-1], tg) / _big_target(grid) - 1).max())
    return c, rel


def main() -> None:
    for name, (c, rel) in (("q (|x| < 1)", fit_small()), ("g (1 <= |x| < 4)", fit_big())):
        print(f"{name}: largest relative error {rel:.2e}")
        print("  " + ", ".join(f"{v:.9e}f" for v in c[::-1]))


if __name__ == "__main__":
    main()
