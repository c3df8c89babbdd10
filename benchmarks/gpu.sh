#!/usr/bin/env bash
# GPU against one CPU thread on a machine with one GPU and no network (benchmarks/bench_gpu.py):
# the permutation fast path, the adversarial search and one training epoch of
# experiments/g2p.toml's model on a fixed CMUdict subset, each as a ratio against this machine's
# one-thread CPU in the same process. Needs torch, numpy, pandas and scipy already installed, and
# installs only the wheels given in $WHEELS (a folder: pydantic, pydantic-core, annotated-types,
# typing-inspection, cmudict, editdistance), offline. No mlflow, no tracking store: the package is
# used from the source tree (PYTHONPATH=src:.). Writes $OUT/gpu.json and $OUT/gpu.md; append
# gpu.md to benchmarks/RESULTS.md by hand.
#
#   OUT=/tmp/gpu WHEELS=/path/to/wheels benchmarks/gpu.sh            # on the GPU machine
#   OUT=/tmp/gpu benchmarks/gpu.sh --dry-run                         # anywhere: CPU only, seconds
#
# Extra arguments go to bench_gpu.py (--words, --permutations, --repeats, …).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the results}"
PY="${PYTHON:-python3}"
if [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" \
        pydantic pydantic-core annotated-types typing-inspection cmudict editdistance
fi
mkdir -p "$OUT"
export PYTHONPATH="src:.${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
exec timeout 480 "$PY" -m benchmarks.bench_gpu --out "$OUT" "$@"
