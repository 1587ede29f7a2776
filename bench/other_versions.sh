#!/usr/bin/env bash
# The test suite against other torch / transformers versions than the installed ones, without
# touching the environment: each version (with the needs this environment lacks or has at other
# versions) goes to its own folder, put first on PYTHONPATH. The GPU image has torch 2.11 and
# transformers 5.17 (../.library/device/KINDS.md), older than this checkout's 2.13 and 5.25, so
# run this before a device call:
#
#   bench/other_versions.sh --torch 2.11.0 --transformers 5.17.0 [pytest arguments]
#
# (the default pytest arguments: the whole suite). A torch from the package index is its CUDA
# build, ~4.6 GB with its CUDA libraries; on a machine without a GPU it runs the CPU kernels.
# Needs pip to reach a package index. Folders are kept (ROOT, default /tmp) for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
root=${ROOT:-/tmp}
paths=()

install() {
    # $1: folder; the rest: pip requirements
    local folder=$1
    shift
    if [[ ! -f $folder/.complete ]]; then
        rm -rf "$folder"
        # the machine's pip constraints may cap torch at the version on its disk
        PIP_CONSTRAINT="" "$PY" -m pip install -q --target "$folder" "$@" \
            || { echo "could not install $* into $folder" >&2; exit 2; }
        touch "$folder/.complete"
    fi
    paths+=("$folder")
}

while [[ $# -gt 0 ]]; do
    case $1 in
    --torch)
        install "$root/entmtp-torch-$2" "torch==$2"
        shift 2 ;;
    --transformers)
        # transformers 5.17-5.23 import httpx and need huggingface-hub < 2
        install "$root/entmtp-transformers-$2" --no-deps "transformers==$2" \
            "huggingface-hub>=1.5,<2" httpx httpcore h11 anyio sniffio certifi idna
        shift 2 ;;
    *)
        break ;;
    esac
done
(( ${#paths[@]} > 0 )) || { echo "usage: bench/other_versions.sh [--torch V] [--transformers V] [pytest arguments]" >&2; exit 2; }
joined=$(IFS=:; echo "${paths[*]}")
export PYTHONPATH=$joined${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c 'import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__)'
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
