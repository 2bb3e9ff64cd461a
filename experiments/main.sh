#!/usr/bin/env bash
# xlkv_autopatch's main job: the P/D greedy-output equivalence and the TTFT benchmark on this
# machine's GPUs (experiments/pd_equivalence.sh, then experiments/pd_bench.sh), stock vs
# ENABLE_XLKV=true (and vLLM's own opt-in where the release has one).
#
# On a machine without GPUs it says so and runs what can run here: `xlkv_autopatch status` and
# real prefill->decode KV transfers through the installed vLLM's own NixlConnector code with
# real NIXL on host memory, stock vs ENABLE_XLKV=true, every block compared byte for byte
# (experiments/cpu/pd_harness.py).  The vLLM for that comes from XLKV_HARNESS_PYTHON (a Python
# with vLLM + nixl) or is installed by experiments/cpu/mkenv.sh (XLKV_VLLM, default 0.21.0) under
# XLKV_ENVS (default /work/envs; about 9 GB on a first run).  Results: XLKV_MAIN_OUT
# (default /tmp/xlkv-main).
#
# exit: 0 pass, 1 a check failed, 2 set-up problem.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUTDIR=${XLKV_MAIN_OUT:-/tmp/xlkv-main}
mkdir -p "$OUTDIR"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  export EQ_JSON=${EQ_JSON:-$OUTDIR/equivalence.json}
  bash experiments/pd_equivalence.sh
  # TTFT is compared with one GPU each for P and D: on fewer, P's and D's compute compete (the
  # KV itself moves at device speed there, lib.sh shared_gpu_ucx), so the main job skips it
  if ! (source experiments/lib.sh && detect_gpus && [ "$NGPU" -ge $((TP_P + TP_D)) ]); then
    echo "the TTFT benchmark is skipped: P and D would share a GPU, where their compute competes."
    echo "The equivalence above ran with P and D sharing the GPU; run this on a machine with a GPU"
    echo "each for P and D for the benchmark (pd_bench.sh times a shared GPU too, marked shared_gpu)."
    exit 0
  fi
  bash experiments/pd_bench.sh
  exit 0
fi

cat <<MSG
==========================================================================================
no GPU on this machine: the GPU equivalence and TTFT benchmark (experiments/pd_equivalence.sh,
experiments/pd_bench.sh) cannot run here.  Running the CPU checks instead:
  1. python -m xlkv_autopatch status  (installed vLLM, flag, activation paths, patch targets)
  2. real P->D KV transfers through vLLM's NixlConnector + NIXL/UCX on host memory,
     stock vs ENABLE_XLKV=true, byte-for-byte (experiments/cpu/pd_harness.py)
Results and logs go to $OUTDIR (XLKV_MAIN_OUT).
MSG
if [ -n "${XLKV_HARNESS_PYTHON:-}" ]; then
  echo "vLLM: the Python in XLKV_HARNESS_PYTHON ($XLKV_HARNESS_PYTHON); nothing is downloaded."
else
  cat <<MSG
vLLM: ${XLKV_VLLM:-0.21.0} (XLKV_VLLM), from the environments folder ${XLKV_ENVS:-/work/envs} (XLKV_ENVS).
  If it is not there yet, experiments/cpu/mkenv.sh installs it now: vLLM, the CUDA torch it pins
  and NIXL from PyPI, about 9 GB of disk and about 5 minutes on a new machine; later runs reuse
  it.  XLKV_HARNESS_PYTHON=/path/to/python uses a Python that already has vLLM + nixl instead.
MSG
fi
cat <<MSG
Expected noise on a machine without CUDA (vLLM's and torch's own import-time messages, harmless):
  "Failed to import from vllm._C: ImportError('libcuda.so.1: ...')" (several times: vLLM tries
  its CUDA extension), "No CUDA runtime is found", "Triton ... 0 active driver(s)", and on some
  releases a Transformers deprecation warning ("Support for Transformers v4 is deprecated").
==========================================================================================
MSG

PY=${XLKV_HARNESS_PYTHON:-}
if [ -z "$PY" ]; then
  VER=${XLKV_VLLM:-0.21.0}
  echo "installing or reusing vLLM $VER + nixl for the CPU checks (experiments/cpu/mkenv.sh)"
  PY=$(bash experiments/cpu/mkenv.sh "$VER" | tail -n 1) || { echo "ERROR: could not install vLLM $VER" >&2; exit 2; }
fi
"$PY" -m pip install -q --disable-pip-version-check "wrapt>=1.14" "packaging>=21" 2>&1 | grep -v "is ignored" || true
"$PY" -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 | grep -E "^ERROR" || true

# the checks themselves: lib.sh cpu_checks (the GPU scripts run the same without a GPU)
source experiments/lib.sh
cpu_checks "$PY" "$OUTDIR"
