"""YAML and text files read without echoing them: errors give a position, never content.

A manifest or workload may name a file that is not what it should be (by
mistake, or a tenant probing what the operator can read), so every error says
where and what was expected. YAML aliases are refused: a few hundred bytes of
nested aliases expand to gigabytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from heddle.exceptions import ConfigError

__all__ = ["read_text", "safe_load_all"]


def read_text(path: Path, what: str, fix: str, error: type[ConfigError] = ConfigError) -> str:
    """The file as UTF-8 text (a leading BOM dropped); one sentence if it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read the {what} {path}: {exc.strerror}; {fix}") from exc
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise error(
            f"the {what} {path} is not UTF-8 text (line {line}, byte {exc.start + 1}); "
            f"save it as UTF-8 or {fix}"
        ) from exc


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise ConfigError(
                f"line {mark.line + 1}: YAML aliases (*name) are not allowed; "
                "write the value out in full"
            )
        return super().compose_node(parent, index)


def safe_load_all(text: str, source: str, error: type[ConfigError] = ConfigError) -> list[Any]:
    """Every document of ``text``; aliases and syntax errors are one sentence naming the line."""
    try:
        return list(yaml.load_all(text, Loader=_NoAliasLoader))  # a SafeLoader subclass
    except ConfigError as exc:
        raise error(f"{source} {exc}") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{source} is not valid YAML{where}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{source} is not valid YAML") from exc
