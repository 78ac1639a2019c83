"""One choice among named values for the kernels being generated: the backend's option inside :meth:`Setting.use`,
else an environment variable, else a default: ``c_runtime.RENDERER`` (which renderer runs CPU kernels, "c" or
"triton")."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator


class Setting:
    def __init__(self, option: str, env: str, values: tuple[str, ...], default: str, what: str) -> None:
        self.option, self.env, self.values, self.default, self.what = option, env, values, default, what
        self._var: contextvars.ContextVar[str | None] = contextvars.ContextVar(f"fusion_{option}", default=None)

    def check(self, value: object, where: str) -> str:
        """``value`` if it is one of :attr:`values`, else one error naming the choices."""
        if value not in self.values:
            raise ValueError(f"{where}: unknown {self.what} {value!r}; choose one of {list(self.values)}")
        return value

    def explicit(self) -> str | None:
        """The value asked for: the option inside :meth:`use`, else the environment variable; None if neither."""
        value = self._var.get()
        if value is None:
            env = os.environ.get(self.env, "").strip().lower()
            value = self.check(env, self.env) if env else None
        return value

    def get(self) -> str:
        return self.explicit() or self.default

    @contextlib.contextmanager
    def use(self, value: str | None) -> Iterator[None]:
        """Kernels generated inside this block take ``value`` (None: leave the choice as it is)."""
        if value is None:
            yield
            return
        token = self._var.set(self.check(value, f"options={{'{self.option}': ...}}"))
        try:
            yield
        finally:
            self._var.reset(token)
