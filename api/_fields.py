"""Reading a manifest's nested mappings with errors that name the field and quote the value."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from heddle.exceptions import ManifestError

__all__ = ["Fields"]


class Fields:
    """One mapping of a manifest, read key by key; :meth:`done` rejects unknown keys.

    ``path`` is where the mapping sits (``spec.sampling``), so every error
    says which field to fix.
    """

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ManifestError(f"{path} must be a mapping, got {type(data).__name__} {data!r}")
        self.data: Mapping[str, Any] = data
        self.path = path
        self._seen: set[str] = set()

    def where(self, key: str) -> str:
        return f"{self.path}.{key}"

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        self._seen.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def required(self, key: str) -> Any:
        self._seen.add(key)
        if self.data.get(key) is None:
            raise ManifestError(f"{self.where(key)} is required")
        return self.data[key]

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str:
        value = self.required(key) if required else self.raw(key, default)
        if not isinstance(value, str) or not value:
            raise ManifestError(f"{self.where(key)}={value!r} must be a non-empty string")
        return value

    def optional_string(self, key: str) -> str | None:
        return self.string(key) if self.has(key) else self.raw(key)

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.string(key, default)
        if value not in choices:
            raise ManifestError(f"{self.where(key)}={value!r}; choose one of {list(choices)}")
        return value

    def integer(
        self, key: str, default: int | None = None, *, minimum: int = 0, maximum: int | None = None
    ) -> int:
        value = self.raw(key, default)
        if value is None:
            raise ManifestError(f"{self.where(key)} is required")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ManifestError(f"{self.where(key)}={value!r} must be an integer")
        if maximum is not None and not minimum <= value <= maximum:
            raise ManifestError(f"{self.where(key)}={value} must be in [{minimum}, {maximum}]")
        if value < minimum:
            raise ManifestError(f"{self.where(key)}={value} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise ManifestError(f"{self.where(key)}={value} must be <= {maximum}")
        return value

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        minimum: float = 0.0,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
    ) -> float:
        value = self.raw(key, default)
        if value is None:
            raise ManifestError(f"{self.where(key)} is required")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ManifestError(f"{self.where(key)}={value!r} must be a number")
        if not math.isfinite(value):  # YAML's .inf and .nan parse as floats
            raise ManifestError(f"{self.where(key)}={value} must be a finite number")
        low_ok = value > minimum if exclusive_minimum else value >= minimum
        if maximum is not None and not (low_ok and value <= maximum):
            low = f"({minimum:g}" if exclusive_minimum else f"[{minimum:g}"
            raise ManifestError(f"{self.where(key)}={value} must be in {low}, {maximum:g}]")
        if not low_ok:
            sign = ">" if exclusive_minimum else ">="
            raise ManifestError(f"{self.where(key)}={value} must be {sign} {minimum}")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ManifestError(f"{self.where(key)}={value!r} must be true or false")
        return value

    def listing(self, key: str) -> list[Any]:
        value = self.raw(key, [])
        if not isinstance(value, list):
            raise ManifestError(f"{self.where(key)}={value!r} must be a list")
        return value

    def sub(self, key: str) -> Fields:
        return Fields(self.raw(key, {}), self.where(key))

    def done(self) -> None:
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            raise ManifestError(
                f"{self.path} has unknown field(s) {unknown}; known: {sorted(self._seen)}"
            )
