#!/usr/bin/env bash
# The side-by-side benchmark's own virtualenv (benchmarks/bench_inseq.py): attnstudy (editable, with
# the [hf] extra) and inseq 0.7.1 in one interpreter, so one process imports both.
#
# inseq 0.7.1 declares eleven nvidia-*-cu11 packages (multi-GB) and pins of its own security
# upgrades; it is installed with --no-deps, then its runtime requirements by name, on the CPU build
# of torch that the project uses. Idempotent: rerunning it reinstalls the same versions.
#
#   benchmarks/inseq_env.sh [VENV]      # default: .venv-inseq at the repository root (git-ignored)
#   VENV/bin/python -m benchmarks.bench_inseq
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-inseq}"
PYTHON="${PYTHON:-python3}"
INSEQ_VERSION=0.7.1
TORCH_VERSION=2.13.0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
# the CPU wheel first, so nothing below pulls a CUDA build (as `make setup`)
"${PIP[@]}" "torch==$TORCH_VERSION" $(if [ -n "${TORCH_INDEX:-}" ]; then echo --index-url "$TORCH_INDEX"; fi)
"${PIP[@]}" -e "$ROOT[hf]"
"${PIP[@]}" --no-deps "inseq==$INSEQ_VERSION"
# inseq's runtime requirements by name (its METADATA without the nvidia-* packages); the rest of
# them (transformers, captum, requests, jinja2, …) come with attnstudy's own requirements above;
# pip then warns that authlib, marshmallow and tornado (security floors, never imported) are missing
"${PIP[@]}" "jaxtyping>=0.2.25" "typeguard<=2.13.3" "treescope>=0.1.0" "rich>=10.13.0" \
    "tqdm>=4.64.0" "matplotlib>=3.5.3" "protobuf>=4.25.8"
# one import of both in one process, and the versions the benchmark reports
"$VENV/bin/python" - <<'PY'
from importlib.metadata import version

import inseq  # noqa: F401
import attnstudy.analysis.attribution  # noqa: F401

print(", ".join(f"{p} {version(p)}" for p in ("inseq", "torch", "transformers", "captum")))
PY
