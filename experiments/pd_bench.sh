#!/usr/bin/env bash
# TTFT benchmark of 1P1D disaggregated serving: stock NixlConnector vs. the shim vs. vLLM's
# own cross-layer opt-in, with `vllm bench serve` (random prompts, streamed) via the proxy.
#
# One call runs the cells CONFIGS x INPUT_LENS, REPS repetitions each, one server pair per
# config.  Each repetition uses its own --seed (so neither P nor D can serve it from its
# prefix cache; the same seeds for every config, so the configs see the same prompts).
# A short warm-up run (WARMUP_PROMPTS) precedes the repetitions of every input length.
# For every repetition the decode instance's NIXL counters (Prometheus deltas, or its
# "KV Transfer metrics" log lines) give descriptors per transfer and per block.
#
# Results go to RESULT_JSON (default ${RESULT_DIR:-experiments/results}/<date>-<vllm>-<gpu>.json); a file
# that exists already is merged with (several calls accumulate; repeated cells gain reps).
#
# Config prefill_only (the physical limit of P/D TTFT): P alone, no D and no proxy, the same
# load sent straight to P with max_tokens=1; report.py gives each config's P/D overhead =
# its mean TTFT - prefill_only's (same input length and state).
#
# BENCH_STATE=fresh (default) or fragmented: in a fragmented cell, after the warm-up, FRAG_PROMPTS
# (400) requests of mixed lengths (FRAG_LEN=2048 x [0.1, 1.9], FRAG_OUTPUT_LEN=16) go through
# the pair first, so the measured requests get blocks from a free queue that has seen many
# requests come and go (vLLM frees a request's blocks in reverse order).  Cells record `state`,
# `avg_descriptors_per_transfer` and `avg_xfer_ms` (D's KV metrics).
#
# Where P/D time goes: per repetition the proxy's /timings (pd_proxy.py) gives the mean time of
# P's answer and of D's first byte after it; cells record them as proxy_prefill_ms and
# proxy_decode_first_ms (report.py prints the split next to the P/D overhead).
#
# env: CONFIGS (default "stock shim native", plus native-v1 on 0.22-0.28; also shim-keep-order,
#      prefill_only), BENCH_STATE, FRAG_PROMPTS, FRAG_LEN, FRAG_OUTPUT_LEN,
#      INPUT_LENS="1024 10240", OUTPUT_LEN=16, REPS=3, WARMUP_PROMPTS=4,
#      NUM_PROMPTS (for every length; default 128 up to 2048 tokens, 64 above),
#      EQ_JSON (equivalence summary of this machine/release, for equivalence_pass),
#      BENCH_TIMEOUT=900 (seconds per bench run), BENCH_EXTRA_ARGS, MODEL, lib.sh's vars,
#      BENCH_ALLOW_SHARED_GPU=1 (time P/D configs even when P and D must share a GPU; see below).
# exit: 0 ok, 1 a bench run failed, 2 set-up, 3 no GPU, 4 shim does not support the release.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

INPUT_LENS=${INPUT_LENS:-1024 10240}
OUTPUT_LEN=${OUTPUT_LEN:-16}
REPS=${REPS:-3}
WARMUP_PROMPTS=${WARMUP_PROMPTS:-4}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-900}
BENCH_EXTRA_ARGS=${BENCH_EXTRA_ARGS:-}
EQ_JSON=${EQ_JSON:-$WORK/equivalence.json}
BENCH_STATE=${BENCH_STATE:-fresh}
FRAG_PROMPTS=${FRAG_PROMPTS:-400}
FRAG_LEN=${FRAG_LEN:-2048}
FRAG_OUTPUT_LEN=${FRAG_OUTPUT_LEN:-16}
case "$BENCH_STATE" in fresh|fragmented) ;; *) die "$EXIT_SETUP" "BENCH_STATE must be fresh or fragmented" ;; esac

setup_env
install_traps
require_gpus_or_cpu_checks
require_vllm
ensure_model
if [ -z "${CONFIGS:-}" ]; then
  CONFIGS="stock shim native"
  if release_gate runner-v1 > /dev/null; then CONFIGS+=" native-v1"; fi
fi
# P/D configs on a shared GPU would time the wrong path (lib.sh bench_gpus_ok): refuse before any
# server starts; prefill_only (P alone) is fine.  BENCH_ALLOW_SHARED_GPU=1 runs them anyway.
if ! why=$(bench_gpus_ok); then
  for cfg in $CONFIGS; do
    [ "$cfg" = prefill_only ] && continue
    die "$EXIT_SETUP" "config $cfg $why. Run on a machine with $((TP_P + TP_D)) GPUs (e.g. \
nvidia-h200-x2), use CONFIGS=prefill_only, or set BENCH_ALLOW_SHARED_GPU=1 to time it anyway."
  done
fi
RESULT_JSON=${RESULT_JSON:-${RESULT_DIR:-$EXP_DIR/results}/$(date +%F)-$VLLM_VERSION-$GPU_SLUG.json}
mkdir -p "$(dirname "$RESULT_JSON")" "$WORK/bench"
rm -f "$COMMANDS_FILE"
log "configs: $CONFIGS; input lengths: $INPUT_LENS; reps: $REPS; results: $RESULT_JSON"

num_prompts_for() {
  if [ -n "${NUM_PROMPTS:-}" ]; then echo "$NUM_PROMPTS"
  elif [ "$1" -le 2048 ]; then echo 128
  else echo 64; fi
}

# bench_run L N SEED RESULT_FILE(or "") LOG [more bench flags]: to BENCH_URL (the proxy; P for
# prefill_only), BENCH_OUT_LEN output tokens
bench_run() {
  local L=$1 N=$2 seed=$3 res=$4 logf=$5
  shift 5
  local -a cmd=("$PY" -m vllm.entrypoints.cli.main bench serve --backend vllm --model "$MODEL"
    --tokenizer "$MODEL" --base-url "$BENCH_URL" --endpoint /v1/completions
    --dataset-name random --random-input-len "$L" --random-output-len "$BENCH_OUT_LEN"
    --num-prompts "$N" --seed "$seed" --ignore-eos
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 "$@")
  if [ -n "$res" ]; then cmd+=(--save-result --result-dir "$(dirname "$res")" --result-filename "$(basename "$res")"); fi
  # shellcheck disable=SC2206
  if [ -n "$BENCH_EXTRA_ARGS" ]; then cmd+=($BENCH_EXTRA_ARGS); fi
  echo "bench: ${cmd[*]}" >> "$COMMANDS_FILE"
  timeout "$BENCH_TIMEOUT" "${cmd[@]}" > "$logf" 2>&1
}

failed=0; skipped=()
for cfg in $CONFIGS; do
  if ! why=$(config_supported "$cfg"); then
    printf '%s\n' "$why" >&2
    if [ "$cfg" = shim ]; then die "$EXIT_UNSUPPORTED" "vLLM $VLLM_VERSION is not supported by the shim (see above)"; fi
    skipped+=("$cfg"); log "skipping $cfg"; continue
  fi
  log "=== $cfg ($BENCH_STATE) ==="
  : > "$COMMANDS_FILE"
  if [ "$cfg" = prefill_only ]; then
    # P alone (stock settings), the load straight to it, one output token
    require_ports_free "$PORT_P" "$SIDE_P"
    assign_gpus
    P_LOG="$WORK/bench-$cfg-p.log"; D_LOG=""; D_REG_REPORT=""
    start_server "P[$cfg]" stock "$PORT_P" "$SIDE_P" "$P_GPUS" "$TP_P" "$P_LOG"
    wait_ready "P[$cfg]" "http://127.0.0.1:$PORT_P/health" "${PIDS[-1]}" "$P_LOG"
    BENCH_URL="http://127.0.0.1:$PORT_P"; BENCH_OUT_LEN=1
  else
    start_pair "$cfg" "bench-$cfg"
    use_registration   # BYTES_PER_BLOCK: what D registered (lib.sh; the dense formula only without a report)
    BENCH_URL="http://127.0.0.1:$PORT_PROXY"; BENCH_OUT_LEN=$OUTPUT_LEN
  fi
  for L in $INPUT_LENS; do
    N=$(num_prompts_for "$L")
    if [ "$WARMUP_PROMPTS" -gt 0 ]; then
      log "$cfg L=$L: warm-up ($WARMUP_PROMPTS prompts)"
      bench_run "$L" "$WARMUP_PROMPTS" 99 "" "$WORK/bench-$cfg-$L-warmup.log" ||
        { tail -n 30 "$WORK/bench-$cfg-$L-warmup.log" >&2; die "$EXIT_FAIL" "warm-up failed ($cfg, L=$L)"; }
      [ -z "$D_LOG" ] || { KV_WAIT=20 wait_kv_lines "$D_LOG" 0 || true; }
    fi
    if [ "$BENCH_STATE" = fragmented ]; then
      log "$cfg L=$L: fragmenting the free block queue: $FRAG_PROMPTS prompts of mixed lengths around $FRAG_LEN"
      frag_out=$FRAG_OUTPUT_LEN; [ "$cfg" != prefill_only ] || frag_out=1
      FRAG_TIMEOUT=$BENCH_TIMEOUT fragmenting_load "$BENCH_URL" "$FRAG_PROMPTS" "$frag_out" "$WORK/bench-$cfg-$L-fragment.log" ||
        die "$EXIT_FAIL" "fragmenting load failed ($cfg, L=$L)"
    fi
    res_files=(); kv_files=(); proxy_files=()
    for rep in $(seq 1 "$REPS"); do
      seed=$((1000 + rep))
      tag="$cfg-$L-$N-r$rep-$(date +%H%M%S)"
      res="$WORK/bench/$tag.json"
      log "$cfg L=$L rep $rep/$REPS: $N prompts, seed $seed"
      if [ -z "$D_LOG" ]; then  # prefill_only: no transfers to count
        if ! bench_run "$L" "$N" "$seed" "$res" "$WORK/bench-$tag.log"; then
          tail -n 30 "$WORK/bench-$tag.log" >&2
          log "ERROR: bench run $tag failed"; failed=1; continue
        fi
        res_files+=("$res"); kv_files+=("$WORK/bench/$tag.kv.json"); proxy_files+=("")
        continue
      fi
      off=$(kv_log_offset "$D_LOG")
      pdtools prom "http://127.0.0.1:$PORT_D/metrics" > "$WORK/bench/$tag.prom0"
      pdtools get "http://127.0.0.1:$PORT_PROXY/timings?reset=1" > /dev/null  # the split of this rep only
      if ! bench_run "$L" "$N" "$seed" "$res" "$WORK/bench-$tag.log"; then
        tail -n 30 "$WORK/bench-$tag.log" >&2
        log "ERROR: bench run $tag failed"; failed=1; continue
      fi
      grep -E "Mean TTFT|Median TTFT|P99 TTFT|Mean ITL|Total token throughput|Failed requests" \
        "$WORK/bench-$tag.log" | sed 's/^/    /' >&2 || true
      pdtools get "http://127.0.0.1:$PORT_PROXY/timings?reset=1" > "$WORK/bench/$tag.proxy.json"
      wait_kv_lines "$D_LOG" "$off" || true
      pdtools prom "http://127.0.0.1:$PORT_D/metrics" > "$WORK/bench/$tag.prom1"
      pdtools kv-run --log "$D_LOG" --offset "$off" \
        --prom-before "$WORK/bench/$tag.prom0" --prom-after "$WORK/bench/$tag.prom1" \
        --bytes-per-block "$BYTES_PER_BLOCK" --backend-log "$D_LOG" \
        ${D_REG_REPORT:+--registration "$D_REG_REPORT"} > "$WORK/bench/$tag.kv.json"
      res_files+=("$res"); kv_files+=("$WORK/bench/$tag.kv.json"); proxy_files+=("$WORK/bench/$tag.proxy.json")
    done
    [ ${#res_files[@]} -gt 0 ] || continue
    meta=$(printf '{"block_size": %d, "tp_p": %d, "tp_d": %d, "model": "%s", "attn_backend": "%s", "state": "%s", "shared_gpu": %s, "ucx_cuda_ipc_get_zcopy": "%s"}' \
      "$BLOCK_SIZE" "$TP_P" "$TP_D" "$MODEL" "$(pdtools backend "${D_LOG:-$P_LOG}")" "$BENCH_STATE" \
      "$( [ "${SHARED_GPU:-0}" = 1 ] && echo true || echo false)" "${UCX_CUDA_IPC_ENABLE_GET_ZCOPY:-}")
    pdtools bench-cell --out "$RESULT_JSON" --config "$cfg" --input-len "$L" \
      --output-len "$BENCH_OUT_LEN" --num-prompts "$N" --results "${res_files[@]}" --kv "${kv_files[@]}" --proxy "${proxy_files[@]}" \
      --commands "$COMMANDS_FILE" --bytes-per-block "$BYTES_PER_BLOCK" --vllm-version "$VLLM_VERSION" \
      --gpu "$GPU_SLUG" --equivalence "$EQ_JSON" --run-prefix "$(hostname)-$(date +%s)" --meta "$meta"
  done
  stop_all
done
[ ${#skipped[@]} -eq 0 ] || log "skipped (not in this release): ${skipped[*]}"
log "results: $RESULT_JSON"
"$PY" "$EXP_DIR/report.py" "$RESULT_JSON" --no-plot || true
exit $failed
