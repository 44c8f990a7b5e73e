"""What a real API server checks beyond a CRD's JSON schema, for the test API server.

Stands in for kube-apiserver's structural defaulting, its CEL validation rules
(``x-kubernetes-validations``) and its ``x-kubernetes-list-type: map`` key
uniqueness. Rules are evaluated with cel-python on the object *after* defaults
are applied, as the API server does; a rule on a field that is absent is not
evaluated. Kubernetes adds CEL libraries of its own: the one function of them
our rules use (``sum()`` from the list library, Kubernetes 1.27+) is provided
here with Kubernetes' meaning.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from typing import Any

import celpy
from celpy import celtypes


def with_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """A copy of ``obj`` with every absent property that has a ``default`` filled in."""
    obj = copy.deepcopy(obj)
    _fill(schema, obj)
    return obj


def _fill(schema: dict[str, Any], obj: Any) -> None:
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                _fill(sub, obj[key])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for item in obj:
            _fill(schema["items"], item)


def rule_errors(schema: dict[str, Any], obj: Any) -> list[str]:
    """``"path: message"`` for every CEL rule and list-map key that ``obj`` breaks."""
    return list(_walk(schema, with_defaults(schema, obj), ""))


def _walk(schema: dict[str, Any], obj: Any, path: str) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations") or ():
        if not _holds(rule["rule"], obj):
            yield f"{path or '<root>'}: {rule.get('message') or 'failed rule: ' + rule['rule']}"
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                yield from _walk(sub, obj[key], f"{path}.{key}" if path else key)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys") or []
            seen = [tuple(item.get(k) for k in keys) for item in obj if isinstance(item, dict)]
            for dup in sorted({k for k in seen if seen.count(k) > 1}, key=str):
                yield f"{path}: Duplicate value: {dict(zip(keys, dup, strict=True))}"
        for i, item in enumerate(obj):
            yield from _walk(schema["items"], item, f"{path}[{i}]")


def _sum(values: celtypes.ListType) -> Any:
    total: Any = celtypes.IntType(0)
    for v in values:
        total = total + v
    return total


@cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule), functions={"sum": _sum})


def _holds(rule: str, value: Any) -> bool:
    result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
    if isinstance(result, celpy.CELEvalError):
        return False  # the API server refuses an object whose rule cannot be evaluated
    return bool(result)
