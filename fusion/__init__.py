"""fusion — operator fusion, the #1 optimization of every ML compiler, built by hand with torch.fx.

Run every phase:  uv run python -m fusion.main
Run one phase:    uv run python -m fusion.trace_basics   (see fusion.main --list)
"""

import logging

# torch.utils.benchmark imports torch.utils.cpp_extension, which warns "No CUDA runtime is found, using CUDA_HOME=..."
# on any machine with a CUDA toolkit but no GPU. It concerns building C++/CUDA extensions, which this course never
# does, so it would only be noise in the lessons' output.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

__version__ = "0.1.0"
