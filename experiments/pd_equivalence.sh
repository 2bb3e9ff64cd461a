#!/usr/bin/env bash
# Greedy-output equivalence of prefill/decode disaggregation, with and without the shim.
#
# For each config in EQ_CONFIGS (default "stock shim") a fresh 1P1D pair is started and the
# same fixed prompts (EQ_LENGTHS tokens, words w2..w31999 chosen deterministically, greedy,
# ignore_eos, EQ_MAX_TOKENS new tokens, token ids and the top-EQ_LOGPROBS logprobs of every
# position returned by the server) are sent
#   (a) directly to the decode instance, without kv_transfer_params: local prefill on D;
#   (b) through the P/D proxy: prefill on P, KV moved by NIXL, decode on D.  For every
#       request of (b) D's Prometheus NIXL counters are read before and after: the blocks D
#       pulled for that request are recorded, and an answer that moved no KV fails the check.
# The baseline is (a) of the first config (stock).  Pass =
#   - every run's token ids are identical to the baseline's;
#   - logprobs (chosen token and top-5, every prompt and position): with deterministic
#     kernels identical to the baseline's (max |difference| = 0); with vLLM's default kernels
#     no P/D config's max difference exceeds stock P/D's (+ EQ_LOGPROB_TOL, default 0);
#   - every P/D answer moved KV;
#   - the shim's transfers use <= 2 descriptors per KV block (id) (<= 1 on FLASH_ATTN and for
#     MLA), measured on a single-request probe of PROBE_LEN tokens from D's Prometheus counters
#     (or its "KV Transfer metrics" log lines), blocks from the bytes per block id D registered;
#   - every negative control asked for is detected (below).
#
# Negative controls: EQ_NEGATIVE_CONTROL="stock,shim" adds the configs nc-stock and nc-shim: the
# same pair, but D starts with experiments/negative_control/ first on its PYTHONPATH, whose
# sitecustomize.py wraps the NIXL connector worker's get_finished and corrupts, for every
# request whose KV has just arrived, one received block (NC_CORRUPTION=shift: the block gets
# the bytes of the block after it, in every layer, as an off-by-one descriptor would;
# swap-layers: layers 0 and 1 of the block trade places).  Only (b) runs for them, right after
# their own config, whose P is kept (only D restarts: one start-up less).  Each must
# differ from the baseline (ids, or logprobs beyond what the uncorrupted config shows): the
# summary records negative_control: [{"config", "corruption", "detected"}].
#
# Reference: EQ_REFERENCE=auto (default) is "local" (the baseline above) for a dense model and
# "pd-stock" for MLA and sliding-window hybrids (pdtools model-family), where vLLM's own P/D,
# stock too, differs from local prefill even with VLLM_BATCH_INVARIANT=1 (0.33.0 on an H100:
# MLA at 4097 tokens from position 3, Gemma 3 at 1000 from position 4).  With "pd-stock" the
# baseline is P/D stock: every P/D config's ids and logprobs must equal it (max |difference| <=
# EQ_LOGPROB_TOL, default 0), every negative control must be told apart from it, and local
# prefill's difference from it is recorded as vLLM's (local_vs_pd_stock), not failing.  It needs
# stock in EQ_CONFIGS (or EQ_INCLUDE).  EQ_REFERENCE=local or pd-stock forces one.
# EQ_REFERENCE=pd-stock-v1 (0.22-0.28): the same with stock-v1 as the baseline, stock P/D on the
# Model Runner V1 that the shim switches to, so the comparison isolates the layout; a stock run
# (vLLM's default runner) is then recorded beside it, not failing.
#
# Bytes per block id: from D's registration report (lib.sh REG_REPORT=1, the default: the
# negative_control/ import hook on D's PYTHONPATH writes what vLLM registered, every config),
# so blocks per transfer and descriptors per block (id) are right for MLA latent pages, several
# KV cache groups and whole block rows.  Without a report only a dense model falls back to the
# dense K/V formula (with a note); the summary's configs.<cfg>.bytes_per_block_source says which.
#
# Prefix caching is off here (EQ_SERVE_ARGS): otherwise D would serve (b) from the blocks
# it cached during (a), and no KV would move at all (the per-request transfer check says so).
#
# Kernels: EQ_BATCH_INVARIANT=auto (default) starts every server with VLLM_BATCH_INVARIANT=1
# when the staged vLLM knows that variable (0.12+): vLLM's deterministic kernels (no split-KV
# attention, no split-K GEMMs), so one token's result does not depend on how it was batched.
# Without it, vLLM's own P/D path can differ from local prefill, stock included: D computes
# the last prompt token over transferred KV in another reduction order than one whole prefill,
# and greedy decoding of a random-weight model flips on a near-tie (seen at the 2049-token
# prompt on 0.21.0 and 0.26.0; with VLLM_BATCH_INVARIANT=1 on 0.26.0 every run is identical).
# EQ_BATCH_INVARIANT=0 keeps vLLM's default kernels; then "pd:shim vs pd:stock" and the
# logprob comparison against stock P/D isolate the shim.  EQ_BATCH_INVARIANT=1 insists (exit 2
# if vLLM does not know it).
#
# env: MODEL, EQ_CONFIGS, EQ_LENGTHS=5,17,100,1000,2049,4097, EQ_MAX_TOKENS=32, EQ_LOGPROBS=5,
#      EQ_LOGPROB_TOL=0, EQ_NEGATIVE_CONTROL="" (e.g. stock,shim), NC_CORRUPTION=shift|swap-layers,
#      EQ_NC_LENGTHS (default EQ_LENGTHS), EQ_KV_WAIT=15 (s to wait for D's counters per request),
#      PROBE_LEN=1600, EQ_JSON (summary path; default $WORK/equivalence.json),
#      EQ_INCLUDE="" (configs run by an earlier call in the same WORK, e.g. "stock shim nc-shim":
#      their run and probe files join this call's summary, so one summary can span calls
#      that each stay under a device call's time limit),
#      EQ_SERVE_ARGS="--no-enable-prefix-caching", EQ_BATCH_INVARIANT=auto|1|0,
#      EQ_REFERENCE=auto|local|pd-stock, MODEL_ARCH (lib.sh: the generated model's family),
#      EQ_FRAGMENT=0 (N > 0: after every pair (re)start, N requests of mixed length around
#      FRAG_LEN=2048 tokens go through the proxy at once (`vllm bench serve`, FRAG_OUTPUT_LEN=16)
#      before the checked prompts, so their KV blocks come from a churned free queue and the
#      shim's descriptor ordering permutes many pairs: the equivalence of issue 14's lever on
#      scattered blocks),
#      plus everything lib.sh reads.
# exit: 0 pass, 1 fail, 2 set-up problem, 3 no GPU (CPU checks only), 4 release unsupported.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

EQ_CONFIGS=${EQ_CONFIGS:-stock shim}
EQ_LENGTHS=${EQ_LENGTHS:-5,17,100,1000,2049,4097}
EQ_MAX_TOKENS=${EQ_MAX_TOKENS:-32}
EQ_LOGPROBS=${EQ_LOGPROBS:-5}
EQ_LOGPROB_TOL=${EQ_LOGPROB_TOL:-0}
EQ_NEGATIVE_CONTROL=${EQ_NEGATIVE_CONTROL:-}
NC_CORRUPTION=${NC_CORRUPTION:-shift}
EQ_NC_LENGTHS=${EQ_NC_LENGTHS:-$EQ_LENGTHS}
EQ_KV_WAIT=${EQ_KV_WAIT:-15}
PROBE_LEN=${PROBE_LEN:-1600}
EQ_JSON=${EQ_JSON:-$WORK/equivalence.json}
SERVE_EXTRA_ARGS="${EQ_SERVE_ARGS---no-enable-prefix-caching} $SERVE_EXTRA_ARGS"
EQ_BATCH_INVARIANT=${EQ_BATCH_INVARIANT:-auto}
EQ_FRAGMENT=${EQ_FRAGMENT:-0}
EQ_REFERENCE=${EQ_REFERENCE:-auto}
FRAG_LEN=${FRAG_LEN:-2048}
FRAG_OUTPUT_LEN=${FRAG_OUTPUT_LEN:-16}

# fragment TAG: the churning load of EQ_FRAGMENT requests through the proxy (nothing if 0)
fragment() {
  [ "$EQ_FRAGMENT" -gt 0 ] || return 0
  log "$1: fragmenting the free block queues: $EQ_FRAGMENT prompts of mixed lengths around $FRAG_LEN"
  fragmenting_load "http://127.0.0.1:$PORT_PROXY" "$EQ_FRAGMENT" "$FRAG_OUTPUT_LEN" "$WORK/eq-fragment-$1.log" ||
    die "$EXIT_FAIL" "fragmenting load failed ($1)"
}
case "$EQ_BATCH_INVARIANT" in auto|0|1) ;;
  *) echo "EQ_BATCH_INVARIANT must be auto, 0 or 1 (got '$EQ_BATCH_INVARIANT')" >&2; exit 2 ;;
esac
case "$EQ_REFERENCE" in auto|local|pd-stock|pd-stock-v1) ;;
  *) echo "EQ_REFERENCE must be auto, local, pd-stock or pd-stock-v1 (got '$EQ_REFERENCE')" >&2; exit 2 ;;
esac

setup_env
install_traps
require_gpus_or_cpu_checks
require_vllm
ensure_model
if [ "$EQ_REFERENCE" = auto ]; then
  case "$MODEL_FAMILY" in mla|sliding-hybrid) EQ_REFERENCE=pd-stock ;; *) EQ_REFERENCE=local ;; esac
  log "reference: $EQ_REFERENCE (EQ_REFERENCE=auto, a $MODEL_FAMILY model)"
else
  log "reference: $EQ_REFERENCE"
fi
if [ "${EQ_REFERENCE#pd-}" != "$EQ_REFERENCE" ]; then
  ref_cfg=${EQ_REFERENCE#pd-}
  case " $EQ_CONFIGS ${EQ_INCLUDE:-} " in *" $ref_cfg "*) ;;
    *) die "$EXIT_SETUP" "EQ_REFERENCE=$EQ_REFERENCE compares with $ref_cfg P/D: put $ref_cfg in EQ_CONFIGS (or EQ_INCLUDE from an earlier call)" ;;
  esac
fi
# A fresh start, except the files of the configs EQ_INCLUDE takes from an earlier call
keep=" "
for cfg in ${EQ_INCLUDE:-}; do keep+="eq-local-$cfg.json eq-pd-$cfg.json eq-probe-$cfg.json eq-$cfg-d-registration.json "; done
for f in "$WORK"/eq-*.json "$WORK"/eq-*.log; do
  [ -e "$f" ] || continue
  case "$keep" in *" $(basename "$f") "*) ;; *) rm -f "$f" ;; esac
done
rm -f "$COMMANDS_FILE"

# Deterministic kernels when the release has them (see the header); the servers inherit it.
unset VLLM_BATCH_INVARIANT
BI_KNOWN=$(pdtools batch-invariant 2>/dev/null || true)
if [ "$EQ_BATCH_INVARIANT" = 0 ]; then
  log "kernels: vLLM defaults (EQ_BATCH_INVARIANT=0)"
elif [ "$BI_KNOWN" = yes ]; then
  export VLLM_BATCH_INVARIANT=1; EQ_BATCH_INVARIANT=1
  log "kernels: VLLM_BATCH_INVARIANT=1 (deterministic; EQ_BATCH_INVARIANT=0 for vLLM's defaults)"
elif [ "$EQ_BATCH_INVARIANT" = 1 ]; then
  die "$EXIT_SETUP" "EQ_BATCH_INVARIANT=1, but vLLM $VLLM_VERSION does not know VLLM_BATCH_INVARIANT (it would be ignored). Use EQ_BATCH_INVARIANT=0."
else
  EQ_BATCH_INVARIANT=0
  log "kernels: vLLM defaults (vLLM $VLLM_VERSION has no VLLM_BATCH_INVARIANT)"
fi

case "$NC_CORRUPTION" in shift|swap-layers) ;;
  *) die "$EXIT_SETUP" "NC_CORRUPTION must be shift or swap-layers (got '$NC_CORRUPTION')" ;;
esac
nc_configs=()
for c in ${EQ_NEGATIVE_CONTROL//,/ }; do nc_configs+=("nc-$c"); done
for n in ${EQ_NC_LENGTHS//,/ }; do
  case ",${EQ_LENGTHS// /,}," in *",$n,"*) ;;
    *) die "$EXIT_SETUP" "EQ_NC_LENGTHS: $n is not in EQ_LENGTHS ($EQ_LENGTHS): a control needs the baseline's answer" ;;
  esac
done

# Order: each negative control right after its own config (it keeps that config's P).
ordered=()
for cfg in $EQ_CONFIGS; do
  ordered+=("$cfg")
  for c in "${nc_configs[@]}"; do [ "$c" = "nc-$cfg" ] && ordered+=("$c"); done
done
for c in "${nc_configs[@]}"; do case " ${ordered[*]} " in *" $c "*) ;; *) ordered+=("$c") ;; esac; done

# The shim must support this release, otherwise say so (with its own status output).
run_configs=()
for cfg in "${ordered[@]}"; do
  if why=$(config_supported "$cfg"); then run_configs+=("$cfg"); continue; fi
  printf '%s\n' "$why" >&2
  case "$cfg" in shim|nc-shim) die "$EXIT_UNSUPPORTED" "vLLM $VLLM_VERSION is not supported by the shim (see above)" ;; esac
  log "skipping $cfg"
done
[ ${#run_configs[@]} -gt 0 ] || die "$EXIT_SETUP" "no config to run"

PD="http://127.0.0.1:$PORT_PROXY/v1/completions"
LOCAL="http://127.0.0.1:$PORT_D/v1/completions"
PROM_D="http://127.0.0.1:$PORT_D/metrics"
run_files=(); probe_args=()
running=""   # config of the pair still running (kept for its negative control)
for cfg in "${run_configs[@]}"; do
  log "=== $cfg ==="
  if [ -n "$running" ] && [ "$cfg" = "nc-$running" ]; then restart_decode "$cfg" "eq-$cfg"
  else stop_all; start_pair "$cfg" "eq-$cfg"; fi
  use_registration   # BYTES_PER_BLOCK: what D registered (or the dense formula, said)
  fragment "$cfg"
  running=""
  case "$cfg" in
    nc-*)  # negative control: only P/D, through a D that corrupts what it received
      pdtools equiv-run --url "$PD" --model "$MODEL" --label "pd:$cfg" --lengths "$EQ_NC_LENGTHS" \
        --max-tokens "$EQ_MAX_TOKENS" --logprobs "$EQ_LOGPROBS" --prom-url "$PROM_D" \
        --bytes-per-block "$BYTES_PER_BLOCK" --kv-wait "$EQ_KV_WAIT" --out "$WORK/eq-pd-$cfg.json"
      run_files+=("$WORK/eq-pd-$cfg.json")
      grep -m 3 "xlkv negative control:" "$D_LOG" >&2 || log "WARNING: no negative-control line in $D_LOG"
      stop_all
      continue ;;
  esac
  # (a) local prefill on D, then (b) P/D through the proxy (with the KV D pulled per request)
  pdtools equiv-run --url "$LOCAL" --model "$MODEL" --label "local:$cfg" --lengths "$EQ_LENGTHS" \
    --max-tokens "$EQ_MAX_TOKENS" --logprobs "$EQ_LOGPROBS" --out "$WORK/eq-local-$cfg.json"
  pdtools equiv-run --url "$PD" --model "$MODEL" --label "pd:$cfg" --lengths "$EQ_LENGTHS" \
    --max-tokens "$EQ_MAX_TOKENS" --logprobs "$EQ_LOGPROBS" --prom-url "$PROM_D" \
    --bytes-per-block "$BYTES_PER_BLOCK" --kv-wait "$EQ_KV_WAIT" --out "$WORK/eq-pd-$cfg.json"
  run_files+=("$WORK/eq-local-$cfg.json" "$WORK/eq-pd-$cfg.json")

  # Descriptor probe: one request of PROBE_LEN tokens (a whole number of blocks), alone.
  # let the lines of the runs above be written (at most 20 s, or KV_WAIT where that is less)
  KV_WAIT=$(( ${KV_WAIT:-60} < 20 ? ${KV_WAIT:-60} : 20 )) wait_kv_lines "$D_LOG" 0 || true
  off=$(kv_log_offset "$D_LOG")
  pdtools prom "$PROM_D" > "$WORK/eq-prom0-$cfg.json"
  pdtools equiv-run --url "$PD" --model "$MODEL" --label "probe:$cfg" --logprobs 0 \
    --lengths "$PROBE_LEN" --seed 7 --max-tokens 2 --out "$WORK/eq-probe-run-$cfg.json" > /dev/null
  wait_kv_lines "$D_LOG" "$off" || true
  pdtools prom "$PROM_D" > "$WORK/eq-prom1-$cfg.json"
  pdtools kv-run --log "$D_LOG" --offset "$off" \
    --prom-before "$WORK/eq-prom0-$cfg.json" --prom-after "$WORK/eq-prom1-$cfg.json" \
    --bytes-per-block "$BYTES_PER_BLOCK" --backend-log "$D_LOG" \
    ${D_REG_REPORT:+--registration "$D_REG_REPORT"} \
    --prompt-len "$PROBE_LEN" --block-size "$BLOCK_SIZE" > "$WORK/eq-probe-$cfg.json"
  probe_args+=(--probe "$cfg=$WORK/eq-probe-$cfg.json")
  running=$cfg
done
stop_all
for cfg in ${EQ_INCLUDE:-}; do  # runs of an earlier call (same WORK)
  found=0
  for f in "$WORK/eq-local-$cfg.json" "$WORK/eq-pd-$cfg.json"; do
    if [ -f "$f" ]; then run_files+=("$f"); found=1; fi
  done
  if [ -f "$WORK/eq-probe-$cfg.json" ]; then probe_args+=(--probe "$cfg=$WORK/eq-probe-$cfg.json"); fi
  [ "$found" = 1 ] || die "$EXIT_SETUP" "EQ_INCLUDE: no run files of $cfg in $WORK"
  log "included from an earlier call: $cfg"
done

meta=$(printf '{"model_family": "%s", "reference": "%s", "vllm_version": "%s", "gpu": "%s", "model": "%s", "block_size": %d, "tp_p": %d, "tp_d": %d, "probe_len": %d, "max_tokens": %d, "serve_args": "%s", "batch_invariant": %s, "logprobs": %d, "negative_control_requested": "%s", "fragment_prompts": %d, "date": "%s"}' \
  "$MODEL_FAMILY" "$EQ_REFERENCE" "$VLLM_VERSION" "$GPU_SLUG" "$MODEL" "$BLOCK_SIZE" "$TP_P" "$TP_D" "$PROBE_LEN" "$EQ_MAX_TOKENS" \
  "$(echo $SERVE_EXTRA_ARGS)" "$([ "$EQ_BATCH_INVARIANT" = 1 ] && echo true || echo false)" "$EQ_LOGPROBS" \
  "$EQ_NEGATIVE_CONTROL${EQ_INCLUDE:+ (included: $EQ_INCLUDE)}" "$EQ_FRAGMENT" "$(date -u +%FT%TZ)")
rc=0
corruption=""
if [ ${#nc_configs[@]} -gt 0 ] || [[ " ${EQ_INCLUDE:-} " == *" nc-"* ]]; then
  corruption=$(pdtools nc-describe "$NC_CORRUPTION")
fi
pdtools equiv-summary --out "$EQ_JSON" --lengths "$EQ_LENGTHS" --meta "$meta" \
  --logprob-tol "$EQ_LOGPROB_TOL" --corruption "$corruption" --reference "$EQ_REFERENCE" \
  "${probe_args[@]}" "${run_files[@]}" || rc=$?
log "summary JSON: $EQ_JSON"
exit $rc
