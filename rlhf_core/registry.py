"""One registry per configurable choice, keyed by the config's own string (verl's ``register_adv_est`` pattern).

Used for advantage estimators (``algorithm.adv_estimator``), policy losses (``policy_loss.loss_mode``) and reward
managers (``reward_model.reward_manager``). Import-light on purpose: reward worker processes import it.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Name → entry, refusing a second entry under a taken name.

    Args:
        kind: what the entries are, as the config key names them (used in error messages), e.g. ``adv_estimator``.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator adding the function or class under ``name`` (an Enum member's ``.value`` is used).

        Raises:
            ValueError: when ``name`` is already registered to another entry.
        """
        key = str(getattr(name, "value", name))

        def decorator(entry: T) -> T:
            if key in self._entries and self._entries[key] is not entry:
                raise ValueError(f"{self.kind} {key!r} is already registered to {self._entries[key]!r}")
            self._entries[key] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        """The entry registered under ``name``.

        Raises:
            ValueError: for an unknown name, listing the registered ones.
        """
        key = str(getattr(name, "value", name))
        if key not in self._entries:
            raise ValueError(f"unknown {self.kind} {key!r}; registered: {self.names()}")
        return self._entries[key]

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return str(getattr(name, "value", name)) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __len__(self) -> int:
        return len(self._entries)
