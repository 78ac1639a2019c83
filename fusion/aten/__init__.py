"""Phase 6's machinery (the lesson is fusion/regions.py): aten capture, collapse/expand, the comparison with Inductor."""
