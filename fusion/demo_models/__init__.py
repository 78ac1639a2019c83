"""What ``fusion.models`` is built from, beside it: the seeding of every demo model's parameters (``seeding.py``)
and Phase 7's sibling models (``siblings.py``). The lessons and tests import neither directly: ``fusion.models``
re-exports them (``models.QKVAttention``, ``models.SEED``, ``models.randomize_batchnorm_``)."""
