"""``python -m fusion.practice``: see :mod:`fusion.practice`."""

from fusion.practice.cli import main

if __name__ == "__main__":  # importing this module (pkgutil.walk_packages does) runs nothing
    raise SystemExit(main())
