"""The Helm chart's plain files: structure, values, CRD copies, dashboard.

Helm, Kubernetes' schemas, kustomize and checkov: test_chart_tools.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "heddle"


def _values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return data


def test_chart_crds_are_copies_of_crds() -> None:
    ours = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    assert ours and chart == ours, (
        "charts/heddle/crds drifted from crds/: cp crds/*.yaml charts/heddle/crds/"
    )


def test_plain_files_are_valid_yaml_and_json() -> None:
    yaml.safe_load((CHART / "Chart.yaml").read_text())
    for path in (ROOT / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        assert crd["kind"] == "CustomResourceDefinition"
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        assert version["additionalPrinterColumns"]
        jsonschema.Draft4Validator.check_schema(version["schema"]["openAPIV3Schema"])
    json.loads((CHART / "values.schema.json").read_text())


def test_values_match_their_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(_values())
    bad = {**_values(), "metrics": {**_values()["metrics"], "port": "9090"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(bad)


def _lookup(values: dict[str, Any], dotted: str) -> bool:
    node: Any = values
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def test_every_values_reference_exists() -> None:
    values = _values()
    refs = set()
    for path in (CHART / "templates").glob("*"):
        refs |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", path.read_text()))
    assert refs
    missing = sorted(r for r in refs if not _lookup(values, r.rstrip(".")))
    assert not missing, f"templates use values that values.yaml lacks: {missing}"


def test_every_value_has_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*[A-Za-z][A-Za-z0-9]*:", line) and not line.rstrip().endswith(":"):
            previous = lines[i - 1].strip() if i else ""
            inline = "#" in line
            assert previous.startswith("#") or inline or _is_nested_default(lines, i), (
                f"values.yaml line {i + 1} has no comment: {line.strip()}"
            )


def _is_nested_default(lines: list[str], i: int) -> bool:
    """Keys inside a documented block (e.g. resources.requests.cpu) share its comment."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    for j in range(i - 1, -1, -1):
        other = lines[j]
        if not other.strip():
            continue
        if len(other) - len(other.lstrip()) < indent:
            return other.rstrip().endswith(":") and (
                j == 0 or "#" in lines[j - 1] or _is_nested_default(lines, j)
            )
    return False


def test_operator_rbac_is_least_privilege() -> None:
    text = (CHART / "templates" / "rbac.yaml").read_text()
    assert "'*'" not in text and '"*"' not in text and "[*]" not in text
    # Secrets: each pool's worker token only needs reading and creating, never listing.
    assert "resources: [secrets]\n  verbs: [get, create]\n" in text
    assert text.count("secrets") == 2  # that rule and the comment saying why


def test_dashboard_queries_metrics_that_exist() -> None:
    dashboard = json.loads((CHART / "dashboards" / "heddle.json").read_text())
    documented = (ROOT / "docs" / "metrics.md").read_text()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(dashboard["panels"]) >= 8
    for expr in exprs:
        for metric in re.findall(r"\b(heddle_[a-z_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            assert base in documented, f"dashboard uses {metric}, not in docs/metrics.md"


def test_example_values_match_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    examples = sorted((ROOT / "examples" / "helm").glob("*.yaml"))
    assert examples
    for path in examples:
        jsonschema.Draft7Validator(schema).validate(yaml.safe_load(path.read_text()))


def test_version_has_one_home() -> None:
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version, (
        "set appVersion in charts/heddle/Chart.yaml to the package version"
    )
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()
