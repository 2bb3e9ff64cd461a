#!/usr/bin/env bash
# One command per device call: run the given steps in order, then copy the results, the
# log tails and this call's console output into $OUT (what comes back from the GPU machine).
#
# usage: bash experiments/run_gpu_cell.sh [--bundle DIR] STEP [STEP ...]
#   stage        copy the bundle chunk(s) carried in this call (DIR/p<N>) to /tmp/stage/DIR
#   setup        verify all chunks (MANIFEST) and unpack vLLM into /tmp/site (once)
#   check        is vLLM staged?  (implied by every step below)
#   status       nvidia-smi, GPU topology, `python -m xlkv_autopatch status`
#   model        generate the random-weight model of MODEL_ARCH (default qwen3; deepseek_v2,
#                gemma3, mqa) into /tmp/xlkv-model (qwen3) or /tmp/xlkv-model-<arch> (if missing)
#   equivalence  pd_equivalence.sh (EQ_* env vars; EQ_NEGATIVE_CONTROL=stock,shim adds the negative
#                controls nc-stock / nc-shim to the same call)
#   bench        pd_bench.sh (CONFIGS, INPUT_LENS, REPS, NUM_PROMPTS, BENCH_STATE ... env vars)
#   wire         wire_copy.py: a timed GPU0 -> GPU1 copy of one 10240-token request's KV bytes
#                (wire-<date>.json in the results; needs two GPUs)
#
# Results on the GPU machine: /tmp/xlkv-results/ (kept while the machine stays warm, so
# several bench calls accumulate into one JSON there); copies go to $OUT each call.
# Exit code: that of the first failing step (see lib.sh for the codes).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
cd "$REPO"

BUNDLE=""
if [ "${1:-}" = "--bundle" ]; then BUNDLE=${2:?--bundle DIR}; shift 2; fi
[ $# -gt 0 ] || { sed -n '2,20p' "$0"; exit 2; }

export SITE=${SITE:-/tmp/site}
export WORK=${WORK:-/tmp/xlkv-exp}
export RESULT_DIR=${RESULT_DIR:-/tmp/xlkv-results}
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$RESULT_DIR" "$OUT"
CONSOLE="$WORK/console-$(date +%H%M%S).txt"
# tee runs in its own session: when `timeout` ends this call it signals its whole process
# group, and a dead tee would make the trap below die of SIGPIPE before it copies anything.
exec > >(exec setsid tee "$CONSOLE") 2>&1

# shellcheck source=lib.sh
source "$HERE/lib.sh"   # site_version (the vLLM release in $SITE), collect_log_tails, ...

require_staged() {
  if [ -z "$(site_version)" ]; then
    if [ -n "$BUNDLE" ] && [ -d "/tmp/stage/$(basename "$BUNDLE")" ]; then
      echo "vLLM not unpacked yet; trying setup of $BUNDLE"
      bash "$HERE/bundle.sh" setup "$BUNDLE"
    else
      echo "ERROR: no vLLM in $SITE. Stage a bundle first (experiments/README.md):"
      echo "  one call per chunk: bash experiments/run_gpu_cell.sh --bundle .xfer21 stage   (carry .xfer21/p<N>)"
      echo "  then:               bash experiments/run_gpu_cell.sh --bundle .xfer21 setup"
      return 2
    fi
  fi
  # equivalence summaries are per release, so bench calls can find the right one
  export EQ_JSON=${EQ_JSON:-$RESULT_DIR/equivalence-$(site_version).json}
}

collect() {
  local rc=$?
  set +e
  trap '' PIPE                         # never die half-way through copying (see tee above)
  [ $rc -eq 0 ] || echo "run_gpu_cell: stopped with exit $rc at $(date -u +%TZ)"
  collect_log_tails "$OUT/logtails.txt" 2>/dev/null
  # the lines that matter from the whole of every server log (not only the tails): the
  # shim's own messages, NIXL registration/descriptor numbers, the backend, errors
  grep -H -n -E "xlkv_autopatch|xlkv negative control|xlkv registration report|KV Transfer metrics|descriptor|[Rr]egist|Using .*backend|attention backend|Traceback|Error|ERROR" \
    "$WORK"/eq-*.log "$WORK"/bench-*-[pd].log 2>/dev/null | cut -c1-600 | head -n 3000 > "$OUT/loggrep.txt"
  # only the staged release's results: the device tool returns a limited number of files, and
  # a second release's files would crowd out the logs (seen in the fourth session)
  local ver f n other=""
  ver=$(site_version)
  for f in "$RESULT_DIR"/*.json "$RESULT_DIR"/*.md "$RESULT_DIR"/*.png; do
    [ -f "$f" ] || continue
    n=$(basename "$f")
    if [ -z "$ver" ] || [[ "$n" == *-"$ver"-* || "$n" == *-"$ver".json || "$n" == wire-* ]]; then cp "$f" "$OUT/"
    else other="$other $n"; fi
  done
  [ -z "$other" ] || echo "run_gpu_cell: kept on the machine (not vLLM $ver):$other"
  for f in "$WORK"/cpu-stock.json "$WORK"/cpu-xlkv.json; do [ -f "$f" ] && cp "$f" "$OUT/"; done
  # D's registration reports (what vLLM registered per config: regions, groups, bytes per block id)
  for f in "$WORK"/*-registration.json; do [ -f "$f" ] && cp "$f" "$OUT/"; done
  echo "run_gpu_cell: exit $rc; files in \$OUT: $(cd "$OUT" && ls | xargs) console.txt"
  sleep 0.3; cp "$CONSOLE" "$OUT/console.txt" 2>/dev/null
  exit $rc
}
trap collect EXIT
trap "exit 143" TERM   # so collect() sees a non-zero status when `timeout` stops the call
trap "exit 130" INT

for step in "$@"; do
  echo "===== step: $step ($(date -u +%TZ)) ====="
  case "$step" in
    stage) bash "$HERE/bundle.sh" stage "${BUNDLE:?stage needs --bundle DIR}" ;;
    setup) bash "$HERE/bundle.sh" setup "${BUNDLE:?setup needs --bundle DIR}" ;;
    check) require_staged; bash "$HERE/bundle.sh" check ;;
    status)
      nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv || echo "no nvidia-smi"
      nvidia-smi topo -m 2>/dev/null || true
      require_staged
      PYTHONPATH="$REPO:$SITE" python3 -m xlkv_autopatch status || true
      PYTHONPATH="$REPO:$SITE" ENABLE_XLKV=true python3 -m xlkv_autopatch status || true ;;
    model)  # make_model.py skips a model it finished before with the same settings (.complete)
      if [ -z "${MODEL:-}" ]; then
        PYTHONPATH="" python3 "$HERE/make_model.py" "$(model_dir_for "$MODEL_ARCH")" --arch "$MODEL_ARCH"
      fi ;;
    equivalence)
      require_staged
      bash "$HERE/pd_equivalence.sh" ;;
    bench)
      require_staged
      bash "$HERE/pd_bench.sh"
      wire=$(ls "$RESULT_DIR"/wire-*.json 2>/dev/null | tail -n 1 || true)  # the wire step's copy, if it ran
      for f in "$RESULT_DIR"/20*.json; do
        if [ -f "$f" ]; then python3 "$HERE/report.py" "$f" ${wire:+--wire "$wire"} > /dev/null || true; fi
      done ;;
    wire)  # the image's torch is enough for a copy; no vLLM needed
      python3 "$HERE/wire_copy.py" --out "$RESULT_DIR/wire-$(date +%F).json" ;;
    *) echo "unknown step '$step' (stage setup check status model equivalence bench wire)"; exit 2 ;;
  esac
done
