"""One generic registry: classes by name, filled by a decorator, asked for with an error that lists the names.

Policies (`policies.REGISTRY`) and drafter families (`sim.drafters.REGISTRY`) are each one `Registry`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from sim.core.errors import ConfigError

T = TypeVar("T")


class Registry(dict[str, type[T]], Generic[T]):
    """name -> class; `kind` ("policy", "drafter") names what it holds in errors."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: the class is registered under `name`, which it also gets as its `name` attribute."""

        def add(cls: type[T]) -> type[T]:
            if name in self:
                raise ConfigError(f"{self.kind} {name!r} registered twice")
            cls.name = name  # type: ignore[attr-defined]
            self[name] = cls
            return cls

        return add

    def get_class(self, name: str) -> type[T]:
        """The class registered as `name`; an unknown name is a user error listing the registered ones."""
        try:
            return self[name]
        except KeyError:
            raise ConfigError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self))}") from None
