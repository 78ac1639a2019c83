"""fusion — operator fusion, the #1 optimization of every ML compiler, built by hand with torch.fx.

Run every phase:  uv run python -m fusion.main
Run one phase:    uv run python -m fusion.trace_basics   (see fusion.main --list)
"""

__version__ = "0.1.0"
