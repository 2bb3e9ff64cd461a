#!/usr/bin/env bash
# Install the test dependencies and run the whole test suite.
#
#   bash tests/run.sh [pytest args]
#
# 1. a virtual environment (.venv-test) with the shim installed editable and
#    tests/requirements.txt (pytest, the experiments' helpers' deps, CPU torch);
# 2. for the real-vLLM tests, one environment per torch pin (tests/harness/mkenv.sh;
#    under $XLKV_ENVS, default /work/envs, reused when present) for each release in
#    XLKV_TEST_VLLM, with the shim installed into it (editable: its .pth and entry point);
# 3. one pytest run over tests/.
#
# XLKV_TEST_VLLM   releases for the real-vLLM tests (default: one per mechanism, the
#                  CI subset); "none" skips them (they then count as skipped, not passed).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${XLKV_TEST_VENV:-.venv-test}
export XLKV_TEST_VLLM=${XLKV_TEST_VLLM-"0.14.1 0.21.0 0.26.0 0.33.0"}
ENVS=${XLKV_ENVS:-/work/envs}
# Disk: a full disk fails pip with "[Errno 28] No space left on device" part-way; say so first.
# Need: ~1.5 GB for $VENV, ~11 GB for each release environment not yet under $XLKV_ENVS.
need_gb=0; [ -x "$VENV/bin/python" ] || need_gb=2
if [ "$XLKV_TEST_VLLM" != "none" ]; then
  for v in $XLKV_TEST_VLLM; do
    [ -f "$ENVS/.prefetch-$v.done" ] || need_gb=$((need_gb + 11))
  done
fi
free_gb=$(( $(df -Pk . | awk 'NR==2{print $4}') / 1048576 ))
if [ "$free_gb" -lt "$need_gb" ]; then
  echo "tests/run.sh: WARNING: $free_gb GB free on $(df -P . | awk 'NR==2{print $6}'), about $need_gb GB needed" \
       "(test venv and release environments under $ENVS not yet built); free space first" >&2
  [ "$free_gb" -ge 1 ] || { echo "tests/run.sh: under 1 GB free: stopping before pip fails part-way" >&2; exit 1; }
fi
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e . -r tests/requirements.txt \
  2> >(grep -v "is ignored: it is neither" >&2)
# Create the releases' environments side by side while the first tests run: on a fresh machine
# this is most of the time (mostly downloads; one at a time it was ~30 min). tests/real's fixture
# calls mkenv.sh again, which waits on the same lock and then reuses the environment.
if [ -z "${XLKV_TEST_PYTHONS:-}" ] && [ "$XLKV_TEST_VLLM" != "none" ]; then
  mkdir -p "$ENVS"
  for v in $XLKV_TEST_VLLM; do
    [ -f "$ENVS/.prefetch-$v.done" ] && continue
    ( bash tests/harness/mkenv.sh "$v" > /dev/null 2> "$ENVS/.prefetch-$v.log" && touch "$ENVS/.prefetch-$v.done" ) &
  done
fi
exec "$VENV/bin/python" -m pytest tests "$@"
