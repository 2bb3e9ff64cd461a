#!/usr/bin/env bash
# Install the test dependencies and run the whole test suite.
#
#   bash tests/run.sh [pytest args]
#
# 1. a virtual environment (.venv-test) with the shim installed editable and
#    tests/requirements.txt (pytest, the experiments' helpers' deps, CPU torch);
# 2. for the real-vLLM tests, one environment per torch pin (experiments/cpu/mkenv.sh;
#    under $XLKV_ENVS, default /work/envs, reused when present) for each release in
#    XLKV_TEST_VLLM, with the shim installed into it (editable: its .pth and entry point);
# 3. one pytest run over tests/.
#
# XLKV_TEST_VLLM   releases for the real-vLLM tests (default: one per mechanism, the
#                  CI subset); "none" skips them (they then count as skipped, not passed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${XLKV_TEST_VENV:-.venv-test}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e . -r tests/requirements.txt \
  2> >(grep -v "is ignored: it is neither" >&2)
export XLKV_TEST_VLLM=${XLKV_TEST_VLLM-"0.14.1 0.21.0 0.26.0 0.33.0"}
# Create the releases' environments side by side while the first tests run: on a fresh machine
# this is most of the time (mostly downloads; one at a time it was ~30 min). tests/real's fixture
# calls mkenv.sh again, which waits on the same lock and then reuses the environment.
if [ -z "${XLKV_TEST_PYTHONS:-}" ] && [ "$XLKV_TEST_VLLM" != "none" ]; then
  ENVS=${XLKV_ENVS:-/work/envs}
  mkdir -p "$ENVS"
  for v in $XLKV_TEST_VLLM; do
    [ -f "$ENVS/.prefetch-$v.done" ] && continue
    ( bash experiments/cpu/mkenv.sh "$v" > /dev/null 2> "$ENVS/.prefetch-$v.log" && touch "$ENVS/.prefetch-$v.done" ) &
  done
fi
exec "$VENV/bin/python" -m pytest tests "$@"
