#!/usr/bin/env bash
# The batch sweep on this machine's CPU: batch-aware bundles against the batch-1 bundles and
# plain decoding at batch sizes 1..16, live, side by side (issue #47's targets).
#
#   bench/batch_sweep.sh latency   time each head type's batched steps (entmtp latency
#                                  --batch-sizes): $OUT/latency-TYPE.json
#   bench/batch_sweep.sh search    re-search the shipped code and math profiles at every batch
#                                  size (entmtp retarget): $OUT/runs/TASK-TYPE/bundle.json
#   bench/batch_sweep.sh bench     the live sweep of each bundle (entmtp bench --batch-sizes):
#                                  $OUT/bench-TASK-TYPE.json
#   bench/batch_sweep.sh all       the three in a row
#
# Time nothing else meanwhile (tests, other benchmarks): the latency and bench steps time steps.
# Settings (environment): OUT (default bench/results/batch-sweep-<cpu slug>), SIZES (1,2,4,8,16),
# NODES (the tree sizes timed: a 2-core CPU gains nothing past a few nodes, and a 128-node tree
# at batch 16 verifies 2,064 rows a step), TYPES (medusa hydra), TASKS (code math), PROMPTS (12
# held-out prompts), NEW_TOKENS (128), THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
ENTMTP=${ENTMTP:-.venv/bin/entmtp}
SIZES=${SIZES:-1,2,4,8,16}
NODES=${NODES:-0,1,2,3,4,5,6,8,12,16}
TYPES=${TYPES:-medusa hydra}
TASKS=${TASKS:-code math}
PROMPTS=${PROMPTS:-12}
NEW_TOKENS=${NEW_TOKENS:-128}
THREADS=${THREADS:-2}
# e.g. amd-f25m17: vendor, family and model (CPUs of one name price trees very differently)
SLUG=$(.venv/bin/python -c "import re; from entmtp.core import cpu_info; \
s = cpu_info().signature or ''; m = re.search(r'family (\d+) model (\d+)', s); \
v = 'amd' if 'AMD' in s else 'intel' if 'Intel' in s else 'cpu'; \
print(f'{v}-f{m[1]}m{m[2]}' if m else v)")
OUT=${OUT:-bench/results/batch-sweep-$SLUG}
mkdir -p "$OUT/runs"

heads_of() {  # the shipped heads of a task's profile: code has its own
  case "$1-$2" in
    code-medusa) echo trees/heads/smollm2-135m-medusa-code ;;
    code-hydra) echo trees/heads/smollm2-135m-hydra-code ;;
    *) echo "trees/heads/smollm2-135m-$2" ;;
  esac
}

latency() {
  for type in $TYPES; do
    "$ENTMTP" latency --heads "$(heads_of math "$type")" --head-type "$type" \
      --batch-sizes "$SIZES" --node-counts "$NODES" --threads "$THREADS" \
      --out "$OUT/latency-$type.json" --plot "$OUT/latency-$type.png" --force
  done
}

search() {
  for type in $TYPES; do
    for task in $TASKS; do
      "$ENTMTP" retarget "trees/profiles/$task-$type" --latency "$OUT/latency-$type.json" \
        --max-nodes "${NODES##*,}" --out "$OUT/runs/$task-$type"
    done
  done
}

bench() {
  for type in $TYPES; do
    for task in $TASKS; do
      "$ENTMTP" bench --task "$task" --bundle "$OUT/runs/$task-$type" \
        --heads "$(heads_of "$task" "$type")" --prompts "$PROMPTS" \
        --max-new-tokens "$NEW_TOKENS" --batch-sizes "$SIZES" --threads "$THREADS" \
        --json "$OUT/bench-$task-$type.json" --force
    done
  done
}

case "${1:-}" in
  latency) latency ;;
  search) search ;;
  bench) bench ;;
  all) latency; search; bench ;;
  *) sed -n 2,18p "$0"; exit 2 ;;
esac
