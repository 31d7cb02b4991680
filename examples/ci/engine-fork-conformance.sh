#!/usr/bin/env bash
# pytest-cbatch conformance gate for an engine fork: the steps of engine-fork-conformance.yml as
# plain shell commands.  Run from the fork's checkout; cbatch-expect.toml lives at its root.
#
# First run, to record the fork's current deviations (then review every reason in the file):
#   CBATCH_EXPECT= ./engine-fork-conformance.sh || true
#   cbatch expect --from-junit cbatch-out/conformance.xml -o cbatch-expect.toml --strict
set -euo pipefail

CBATCH_IMPL="${CBATCH_IMPL:-vllm}"
# Space-separated pip requirements: pytest-cbatch, and the adapter that registers CBATCH_IMPL.
CBATCH_PACKAGES="${CBATCH_PACKAGES:-git+https://github.com/your-org/pytest-cbatch@v0.1.0 \
git+https://github.com/your-org/pytest-cbatch@v0.1.0#subdirectory=examples/vllm}"
CBATCH_EXPECT="${CBATCH_EXPECT-cbatch-expect.toml}"
export HF_HUB_OFFLINE=1
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$(mktemp -d)}"

python -m pip install -e .                      # the engine fork, as your CI builds it
read -r -a packages <<< "$CBATCH_PACKAGES"
python -m pip install "${packages[@]}"

expect=()
if [ -n "$CBATCH_EXPECT" ]; then
    expect=(--cbatch-expect="$CBATCH_EXPECT" --cbatch-expect-strict)
fi
mkdir -p cbatch-out
# JUnit XML and the replay traces of failures (.jsonl, with the `cbatch check` command that replays
# each in its failure message) are left in cbatch-out/ for your CI to keep.
python -m pytest --cbatch-impl="$CBATCH_IMPL" --cbatch-profile=ci "${expect[@]}" \
    --cbatch-artifacts=cbatch-out/failures --junitxml=cbatch-out/conformance.xml \
    -p no:cacheprovider -q -rxXf
