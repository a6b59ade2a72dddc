"""Name -> class registries for acoustic models and vocoders.

Workers pick their model by name from the settings (``VOCODER=griffinlim``), so a neural model
added later only has to register itself. Registering costs nothing: a class is stored, or for
:meth:`Registry.register_lazy` only a ``"module:Class"`` string, so importing a registry never
imports torch-heavy model code or loads weights; that happens in ``load`` inside the worker,
after the fork.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownModel(KeyError):
    """No model of that name is registered; ``.valid`` lists the names that are."""

    def __init__(self, kind: str, name: str, valid: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.valid = valid
        super().__init__(f"unknown {kind} {name!r}; registered: {', '.join(valid) or '(none)'}")

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.args[0]


class Registry(Generic[T]):
    """A named collection of model classes of one kind (``"acoustic"``, ``"vocoder"``)."""

    def __init__(self, kind: str, base: type[T]) -> None:
        self.kind = kind
        self.base = base
        self._classes: dict[str, type[T] | str] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: ``@registry.register("hifigan")``. Sets ``cls.registry_name``."""

        def decorate(cls: type[T]) -> type[T]:
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"{cls!r} is not a subclass of {self.base.__name__}")
            self._add(name, cls)
            cls.registry_name = name  # type: ignore[attr-defined]
            return cls

        return decorate

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``"package.module:ClassName"`` without importing it until it is loaded."""
        if ":" not in target:
            raise ValueError(f"lazy target must look like 'module:Class', got {target!r}")
        self._add(name, target)

    def _add(self, name: str, entry: type[T] | str) -> None:
        existing = self._classes.get(name)
        if existing is not None and existing is not entry:
            raise ValueError(f"{self.kind} {name!r} is already registered to {existing!r}")
        self._classes[name] = entry

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._classes)

    def get(self, name: str) -> type[T]:
        """The class registered as ``name`` (importing a lazy one now)."""
        try:
            entry = self._classes[name]
        except KeyError:
            raise UnknownModel(self.kind, name, self.names()) from None
        if isinstance(entry, str):
            module_name, _, attr = entry.partition(":")
            cls = getattr(importlib.import_module(module_name), attr)
            if not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise TypeError(f"{entry} is not a subclass of {self.base.__name__}")
            cls.registry_name = name  # type: ignore[attr-defined]
            self._classes[name] = entry = cls
        return entry

    def load(self, name: str, device: str = "cpu", **kwargs: Any) -> T:
        """Build the model: ``cls.from_checkpoint(checkpoint, device)`` when ``checkpoint=`` is
        given, else ``cls(device=device, **kwargs)``."""
        cls = self.get(name)
        checkpoint = kwargs.pop("checkpoint", None)
        if checkpoint is not None:
            return cls.from_checkpoint(checkpoint, device, **kwargs)  # type: ignore[attr-defined]
        return cls(device=device, **kwargs)  # type: ignore[call-arg]  # every model takes device=
