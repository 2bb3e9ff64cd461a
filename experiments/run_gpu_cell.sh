#!/usr/bin/env bash
# One command per device call: run the given steps in order, then copy the results, the log tails
# and this call's console output into $OUT (what comes back from the GPU machine).
#
# usage: bash experiments/run_gpu_cell.sh [--bundle DIR] STEP [STEP ...]
#   steps: stage setup check status model equivalence bench wire (pdtools/job_cell.py says what
#   each does; experiments/README.md how a lease uses them).  Exit code: that of the first failing
#   step.
set -euo pipefail
exec "${PY:-python3}" "$(dirname "${BASH_SOURCE[0]}")/pdtools" cell "$@"
