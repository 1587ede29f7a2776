#!/usr/bin/env bash
# The test suite against another transformers version than the one installed, without touching
# the environment: that version (and the versions of its needs that this environment's differ
# from) goes to a folder put first on PYTHONPATH. The GPU image has transformers 5.17
# (../.library/device/KINDS.md), older than this checkout's, so run this before a device call:
#
#   bench/other_transformers.sh 5.17.0 [pytest arguments, default: the whole suite]
#
# Needs pip to reach a package index. The folder is kept (TARGET, default
# /tmp/entmtp-transformers-VERSION) for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: bench/other_transformers.sh VERSION [pytest arguments]}
shift
PY=${PYTHON:-.venv/bin/python}
target=${TARGET:-/tmp/entmtp-transformers-$version}
if [[ ! -f $target/.complete ]]; then
    rm -rf "$target"
    # transformers 5.17-5.23 import httpx and need huggingface-hub < 2
    "$PY" -m pip install -q --no-deps --target "$target" "transformers==$version" \
        "huggingface-hub>=1.5,<2" httpx httpcore h11 anyio sniffio certifi idna \
        || { echo "could not install transformers==$version into $target" >&2; exit 2; }
    touch "$target/.complete"
fi
PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH} "$PY" -c \
    'import transformers; print("transformers", transformers.__version__, "from", transformers.__file__)'
PYTHONPATH=$target${PYTHONPATH:+:$PYTHONPATH} exec "$PY" -m pytest -q -p no:cacheprovider "$@"
