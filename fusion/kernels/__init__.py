"""Kernel back-ends the lessons call but a learner need not read: library epilogues (cuBLASLt, cuDNN) with their
autograd/autocast handling, and the Triton runtime that compiles and launches generated kernels."""
