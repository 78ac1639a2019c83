"""``python -m fusion.practice``: see :mod:`fusion.practice`."""

from fusion.practice.cli import main

raise SystemExit(main())
