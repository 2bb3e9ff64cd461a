#!/usr/bin/env bash
# TTFT benchmark of 1P1D disaggregated serving, stock vs the shim vs vLLM's own opt-in: the lab's
# bench job (pdtools/job_bench.py).  Settings (CONFIGS, INPUT_LENS, REPS, BENCH_STATE, ...) and
# results: experiments/README.md.  exit: 0 ok, 1 a bench run failed, 2 set-up, 3 no GPU,
# 4 shim does not support the release.
set -euo pipefail
exec "${PY:-python3}" "$(dirname "${BASH_SOURCE[0]}")/pdtools" bench "$@"
