#!/usr/bin/env bash
# Greedy-output equivalence of prefill/decode disaggregation with and without the shim: the lab's
# equivalence job (pdtools/job_equivalence.py).  Settings (EQ_*), checks and results:
# experiments/README.md.  exit: 0 pass, 1 fail, 2 set-up problem, 3 no GPU (CPU checks only),
# 4 release unsupported.
set -euo pipefail
exec "${PY:-python3}" "$(dirname "${BASH_SOURCE[0]}")/pdtools" equivalence "$@"
