#!/usr/bin/env bash
# Build arctic-inference's wheel (vLLM's suffix decoding) once and install it into the
# environment of PYTHON with --no-deps. PyPI ships no wheel of the pinned release, so:
#   1. a build venv of its own with requirements/arctic-inference-build.txt, which also sees
#      PYTHON's site-packages (a .pth file) for torch: setup.py imports torch, the extension
#      does not link it;
#   2. `pip wheel --no-build-isolation` with CMAKE_ARGS=-DPython_EXECUTABLE=<build venv
#      python>: only then does CMake find nanobind (`python -m nanobind --cmake_dir`);
#   3. the wheel is kept in $HEDDLE_WHEEL_CACHE (default ~/.cache/heddle/wheels), so a
#      second setup on the same machine (or image layer) installs it without building.
# Usage: requirements/build-arctic-inference.sh PYTHON   (the Makefile: .venv/bin/python)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="${1:?usage: $0 PYTHON}"
pin="$(grep -v '^#' "$here/arctic-inference.txt" | grep -m1 .)"
version="${pin#*==}"
cache="${HEDDLE_WHEEL_CACHE:-$HOME/.cache/heddle/wheels}"
tag="$("$target" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
wheel="$(ls "$cache"/arctic_inference-"$version"-"$tag"-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$wheel" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    "$target" -c 'import sys; print(sys.base_prefix)' >/dev/null
    base="$("$target" -c 'import sys; print(sys.base_prefix)')/bin/python3"
    [ -x "$base" ] || base="$target"
    "$base" -m venv "$work/venv"
    "$work/venv/bin/python" -m pip install --quiet --upgrade pip
    "$work/venv/bin/python" -m pip install --quiet -r "$here/arctic-inference-build.txt"
    purelib="$("$target" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    buildlib="$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "$purelib" > "$buildlib/heddle-target-env.pth"  # after the venv's own: its pins win
    mkdir -p "$cache"
    PATH="$work/venv/bin:$PATH" CMAKE_ARGS="-DPython_EXECUTABLE=$work/venv/bin/python" \
        "$work/venv/bin/python" -m pip wheel --quiet --no-build-isolation --no-deps \
        --no-binary arctic-inference -w "$work/wheels" "$pin"
    mv "$work"/wheels/arctic_inference-*.whl "$cache"/
    wheel="$(ls "$cache"/arctic_inference-"$version"-"$tag"-*.whl | head -n1)"
fi
"$target" -m pip install --quiet --no-deps "$wheel"
