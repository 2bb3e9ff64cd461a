#!/usr/bin/env bash
# vLLM's own NIXL unit tests on a lent GPU machine, stock vs ENABLE_XLKV=true: the lab's upstream
# job (pdtools/job_upstream.py says what each command does).
#   here:  bash experiments/upstream/gpu.sh pack DIR RELEASE... | pack-shim DIR [COMMIT]
#   there: bash experiments/upstream/gpu.sh unpack DIR | run RELEASE WHERE [N]
set -euo pipefail
exec "${PY:-python3}" "$(dirname "${BASH_SOURCE[0]}")/../pdtools" upstream "$@"
