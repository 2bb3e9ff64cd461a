#!/usr/bin/env bash
# xlkv_autopatch's main job: the P/D greedy-output equivalence and the TTFT benchmark on this
# machine's GPUs, stock vs ENABLE_XLKV=true; on a machine without GPUs it says so and runs the CPU
# checks (real P->D KV transfers through vLLM's NixlConnector + NIXL on host memory, stock vs
# ENABLE_XLKV=true, byte for byte).  The lab's main job (pdtools/job_main.py; settings:
# experiments/README.md).  exit: 0 pass, 1 a check failed, 2 set-up problem.
set -euo pipefail
exec "${PY:-python3}" "$(dirname "${BASH_SOURCE[0]}")/pdtools" main "$@"
