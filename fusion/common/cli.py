"""Running a lesson: ``python -m fusion.<phase>`` and ``fusion.main`` share this, and both turn an unsolved exercise
(a NotImplementedError whose message starts with "TODO(human)") into a short message instead of a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from fusion.common.todo import is_todo, todo_message


def plain(text: str) -> str:
    """Docstring text for a terminal: reStructuredText's ``double backticks`` and `single backticks` dropped."""
    return text.replace("``", "").replace("`", "")


def lesson_name(module: str | None) -> str | None:
    """``fusion.regions`` for a lesson's ``__name__``, also when it runs as ``python -m`` (``__main__``)."""
    if module == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        return spec.name if spec is not None else None
    return module


def cli_prog(module: str | None) -> str | None:
    """``python -m <module>`` for argparse's usage line; run as ``-m``, a module's ``__name__`` is "__main__"."""
    return f"python -m {name}" if (name := lesson_name(module)) else None


def lesson_cli(run: Callable[..., object], doc: str | None, argv: Sequence[str] | None = None) -> int:
    """The command line every phase module shares: ``python -m fusion.<phase> [--quick] [--plot FILE.png]``.
    ``--plot`` where the lesson has a picture (``fusion.viz.PICTURES``), drawn after the lesson from its module."""
    from fusion import viz

    first, module = plain(doc or "").strip().splitlines(), getattr(run, "__module__", None)
    parser = argparse.ArgumentParser(prog=cli_prog(module), description=first[0] if first else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer examples (what CI runs)")
    if draw := viz.picture_of(name := lesson_name(module)):
        parser.add_argument("--plot", metavar="FILE.png", help=f"then save its picture ({viz.extra(name)})")
    args = parser.parse_args(argv)
    if (path := getattr(args, "plot", None)) and not viz.have_matplotlib():
        parser.error(viz.plot_hint(name, path))  # before the lesson runs, not after

    def lesson() -> None:
        run(quick=args.quick)
        if path:  # the lesson's own module: under `python -m` it is __main__, whose backend Dynamo calls
            draw(sys.modules[module], path, args.quick)
            print(f"\npicture: {path}")

    return run_lesson(lesson)


def run_lesson(fn: Callable[[], object]) -> int:
    """Run one lesson; an unsolved TODO(human) prints its message and file:line, and returns 1 (no traceback)."""
    try:
        fn()
    except NotImplementedError as e:
        if not is_todo(e):
            raise
        print(f"\n{todo_message(e)}", file=sys.stderr)
        return 1
    return 0
