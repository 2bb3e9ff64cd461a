# shellcheck shell=bash
# Shared shell functions of the P/D experiment scripts.  Source it; do not run it.
#
#   source "$(dirname "$0")/lib.sh"
#
# It starts one prefill (P) and one decode (D) vLLM instance with NixlConnector plus the
# P/D proxy (pd_proxy.py), and stops all of them on exit (trap).  Settings (env vars):
#
#   SITE=/tmp/site          where the staged vLLM bundle lives (added to PYTHONPATH)
#   MODEL=<dir>             model to serve; default: generated into /tmp/xlkv-model (MODEL_ARCH=qwen3)
#                           or /tmp/xlkv-model-<arch>
#   MODEL_ARCH=qwen3        family of the generated model (make_model.py --arch: qwen3,
#                           deepseek_v2, gemma3, mqa); ignored when MODEL is given
#   REG_REPORT=1            D writes its registration report (negative_control/ hook on D's
#                           PYTHONPATH, XLKV_REGISTRATION_REPORT): bytes per block id; 0: off
#   WORK=/tmp/xlkv-exp      logs and intermediate files of a run
#   TP_P=1 TP_D=1           tensor-parallel size of P and D
#   GPU_MEM_UTIL=0.3        --gpu-memory-utilization when P and D have their own GPUs
#   GPU_MEM_UTIL_SHARED=0.25  ... when P and D share a GPU
#   PORT_PROXY=8000 PORT_P=8100 PORT_D=8200   HTTP ports (127.0.0.1)
#   SIDE_P=5600 SIDE_D=5700 VLLM_NIXL_SIDE_CHANNEL_PORT of P and D
#   BLOCK_SIZE=16 MAX_MODEL_LEN=16384
#   READY_TIMEOUT=600       seconds to wait for a server to answer /health
#   SERVE_EXTRA_ARGS=""     more `vllm serve` flags (word-split)
#   XLKV_ACTIVE_RE          log line that proves the shim is active in a server
#
# Exit codes used by the scripts:
EXIT_FAIL=1          # a check failed (outputs differ, descriptors too many, bench error)
EXIT_SETUP=2         # set-up problem: vLLM not staged, port in use, server did not start
EXIT_NO_GPU=3        # no GPU here: only the CPU checks ran (and passed)
EXIT_UNSUPPORTED=4   # the staged vLLM release is not supported by the shim

EXP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$EXP_DIR/.." && pwd)
: "${SITE:=/tmp/site}"
: "${PY:=python3}"
: "${WORK:=/tmp/xlkv-exp}"
: "${TP_P:=1}" "${TP_D:=1}"
: "${GPU_MEM_UTIL:=0.3}" "${GPU_MEM_UTIL_SHARED:=0.25}"
: "${PORT_PROXY:=8000}" "${PORT_P:=8100}" "${PORT_D:=8200}"
: "${SIDE_P:=5600}" "${SIDE_D:=5700}"
: "${BLOCK_SIZE:=16}" "${MAX_MODEL_LEN:=16384}"
: "${READY_TIMEOUT:=600}" "${STOP_TIMEOUT:=30}"
: "${SERVE_EXTRA_ARGS:=}"
: "${MODEL_ARCH:=qwen3}" "${REG_REPORT:=1}"
: "${XLKV_ACTIVE_RE:=xlkv_autopatch: .* is active}"
mkdir -p "$WORK"

# ---------------------------------------------------------------- messages ----------------
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { local code=$1; shift; printf '\nERROR: %s\n' "$*" >&2; exit "$code"; }

# pdtools SUBCOMMAND ...: the helpers package (experiments/pdtools/, see its cli.py).
pdtools() { "$PY" "$EXP_DIR/pdtools" "$@"; }

# ---------------------------------------------------------------- environment -------------
# PYTHONPATH: the repository first (its sitecustomize.py activates the shim when
# ENABLE_XLKV is on; with the flag off it does nothing), then the staged vLLM.
# SHIM_PATH (default: this checkout) is where xlkv_autopatch and that sitecustomize.py live.
setup_env() {
  export PYTHONPATH="${SHIM_PATH:-$REPO_DIR}:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export VLLM_USE_FLASHINFER_SAMPLER=0          # flashinfer is not in the bundle
  export VLLM_LOG_STATS_INTERVAL="${VLLM_LOG_STATS_INTERVAL:-3}"  # KV Transfer metrics lines
  export PYTHONUNBUFFERED=1
  unset ENABLE_XLKV                              # set per server, never globally
}

# vLLM release from package metadata (fast: does not import vLLM).
vllm_version() {
  "$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null
}

# Is vLLM importable at all?  Sets VLLM_VERSION or exits with a clear message.
require_vllm() {
  VLLM_VERSION=$(vllm_version) || true
  if [ -z "${VLLM_VERSION:-}" ]; then
    die "$EXIT_SETUP" "vLLM is not importable (PYTHONPATH=$PYTHONPATH).
  Stage the bundle first (experiments/README.md): one call per chunk
  'bash experiments/run_gpu_cell.sh --bundle DIR stage', then '... --bundle DIR setup'."
  fi
  export VLLM_VERSION
  log "vLLM $VLLM_VERSION from $("$PY" -c 'import importlib.util as u; print(u.find_spec("vllm").origin)' 2>/dev/null)"
}

# vLLM release staged in $SITE, from its package metadata ("" when there is none).
site_version() { PYTHONPATH="$SITE" vllm_version || true; }

# ---------------------------------------------------------------- GPUs -----------------------
# Sets NGPU and GPU_NAMES (newline separated) and GPU_SLUG ("2xH200").  Returns 1 when none.
detect_gpus() {
  NGPU=0; GPU_NAMES=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    GPU_NAMES=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true)
    NGPU=$(printf '%s' "$GPU_NAMES" | grep -c . || true)
  fi
  GPU_SLUG=$(printf '%s\n' "$GPU_NAMES" | pdtools gpu-slug)
  export NGPU GPU_SLUG
  [ "$NGPU" -gt 0 ]
}

# cpu_checks PYTHON OUTDIR: what runs without a GPU, the one copy of it (main.sh's CPU path and
# cpu_only_checks below): `xlkv_autopatch status`, then real P->D KV transfers through the
# installed vLLM's own NixlConnector + NIXL on host memory (experiments/cpu/pd_harness.py), stock
# and ENABLE_XLKV=true, every block compared byte for byte, and their table (the shim must bring
# the descriptors per block down, to at most 2).  PYTHON needs vLLM, nixl and the shim
# importable; results OUTDIR/cpu-{stock,xlkv}.json (and .log).  Returns non-zero when a check fails.
cpu_checks() {
  local py=$1 out=$2 rc=0 cfg
  mkdir -p "$out"
  ( cd / && "$py" -m xlkv_autopatch status ) || rc=1
  for cfg in stock xlkv; do
    local env_flag=(env)
    [ "$cfg" = xlkv ] && env_flag=(env ENABLE_XLKV=true)
    echo "--- P->D transfer, $cfg"
    "${env_flag[@]}" timeout "${HARNESS_TIMEOUT:-900}" "$py" "$EXP_DIR/cpu/pd_harness.py" \
      --out "$out/cpu-$cfg.json" > "$out/cpu-$cfg.log" 2>&1 || true
  done
  python3 - "$out" <<'PY' || rc=1
import json, sys, os
out = sys.argv[1]
rows, ok = [], True
for cfg in ("stock", "xlkv"):
    path = os.path.join(out, "cpu-%s.json" % cfg)
    d = json.load(open(path)) if os.path.exists(path) else {"errors": ["no result (see %s)" % path.replace(".json", ".log")]}
    rows.append((cfg, d))
    ok &= bool(d.get("transfer_verified"))
print("%-6s %-8s %-12s %-8s %-16s %s" % ("config", "vLLM", "cross-layer", "regions", "descs per block", "bytes verified"))
for cfg, d in rows:
    print("%-6s %-8s %-12s %-8s %-16s %s" % (cfg, d.get("vllm"), d.get("cross_layer"), d.get("num_regions"),
                                            d.get("descs_per_block"), d.get("transfer_verified")))
    for e in d.get("errors") or []:
        print("   error: %s" % str(e)[:300])
s, x = rows[0][1].get("descs_per_block"), rows[1][1].get("descs_per_block")
if ok and isinstance(s, int) and isinstance(x, int):
    ok = x < s and x <= 2
    print("descriptors per block: stock %s -> xlkv %s (%s)" % (s, x, "OK" if ok else "NOT fewer"))
print("CPU checks: %s (GPU runs skipped: no GPU)" % ("PASS" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
  return $rc
}

# The GPU scripts' CPU checks: cpu_checks with XLKV_HARNESS_PYTHON (a Python whose vLLM runs on
# CPU, e.g. from experiments/cpu/mkenv.sh; default $PY), results in $WORK.  CPU_CHECKS_CMD
# replaces it (a shell command; tests use it).
cpu_only_checks() {
  if [ -n "${CPU_CHECKS_CMD:-}" ]; then bash -c "$CPU_CHECKS_CMD"; return; fi
  cpu_checks "${XLKV_HARNESS_PYTHON:-$PY}" "$WORK"
}

# Call at the start of every GPU script.
require_gpus_or_cpu_checks() {
  if detect_gpus; then
    log "GPUs: $NGPU ($(printf '%s' "$GPU_NAMES" | sort | uniq -c | xargs))"
    return 0
  fi
  echo "no GPU on this machine: running CPU checks only" >&2
  echo "(vLLM's 'Failed to import from vllm._C: ... libcuda.so.1' warnings below are its own, harmless without CUDA)" >&2
  if cpu_only_checks; then
    echo "CPU checks passed; GPU experiments skipped (exit $EXIT_NO_GPU)" >&2
    exit "$EXIT_NO_GPU"
  fi
  die "$EXIT_FAIL" "no GPU, and the CPU checks failed"
}

# Splits the GPUs between P and D.  Sets P_GPUS, D_GPUS (CUDA_VISIBLE_DEVICES values),
# MEM_UTIL and SHARED_GPU (1 when P and D share at least one GPU).
assign_gpus() {
  local need=$((TP_P + TP_D))
  local max=$((TP_P > TP_D ? TP_P : TP_D))
  if [ "$NGPU" -ge "$need" ]; then          # everybody gets their own GPUs
    P_GPUS=$(seq -s, 0 $((TP_P - 1)))
    D_GPUS=$(seq -s, "$TP_P" $((need - 1)))
    SHARED_GPU=0; MEM_UTIL=$GPU_MEM_UTIL
  elif [ "$NGPU" -ge "$max" ]; then         # overlap: P from the front, D from the back
    P_GPUS=$(seq -s, 0 $((TP_P - 1)))
    D_GPUS=$(seq -s, $((NGPU - TP_D)) $((NGPU - 1)))
    SHARED_GPU=1; MEM_UTIL=$GPU_MEM_UTIL_SHARED
  else
    die "$EXIT_SETUP" "TP_P=$TP_P TP_D=$TP_D need at least $max GPUs; this machine has $NGPU"
  fi
  log "GPU split: P on [$P_GPUS] (TP $TP_P), D on [$D_GPUS] (TP $TP_D), memory utilization $MEM_UTIL$( [ "$SHARED_GPU" = 1 ] && echo ', shared GPU')"
  shared_gpu_ucx
}

# shared_gpu_ucx: on a shared GPU (SHARED_GPU=1) the servers get UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
# unless the caller set it.  UCX turns cuda_ipc's get-zcopy (NIXL's READ) off when it sees no
# NVLink, which it never does with one GPU; READs then go through software emulation over
# tcp/lo.  Measured 2026-11-24 on 1xH100 (experiments/probes/ucx_same_gpu.py, two processes):
# 1.17 GB in 2.85-3.08 s (0.40 GB/s) with UCX's default, 0.91 ms (1292 GB/s) with the variable;
# inside vLLM 0.15.1 a 450 MB transfer 1056 ms -> 1.7 ms, equivalence PASS
# (experiments/results/2026-11-24-*).  2026-11-23's 114 s TTFT on a shared H200 was this path.
shared_gpu_ucx() {
  [ "${SHARED_GPU:-0}" = 1 ] || return 0
  if [ -z "${UCX_CUDA_IPC_ENABLE_GET_ZCOPY+x}" ]; then
    export UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y
    log "shared GPU: UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y (UCX's default turns cuda_ipc READs off without NVLink: 0.4 GB/s)"
  fi
}

# bench_gpus_ok: 0 when P and D get their own GPUs (NGPU >= TP_P + TP_D; detect_gpus first),
# when they share one with cuda_ipc READs on (UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y, shared_gpu_ucx),
# or BENCH_ALLOW_SHARED_GPU=1; otherwise prints why a P/D TTFT would mean nothing and returns 1.
# On a shared GPU with get-zcopy the KV moves at device speed, but P's and D's compute compete:
# such cells say "shared_gpu": true and are not comparable with two-GPU cells.
bench_gpus_ok() {
  local need=$((TP_P + TP_D))
  if [ "$NGPU" -ge "$need" ] || [ "${BENCH_ALLOW_SHARED_GPU:-0}" = 1 ]; then return 0; fi
  case "${UCX_CUDA_IPC_ENABLE_GET_ZCOPY-y}" in y|yes|on|1) return 0 ;; esac   # unset: shared_gpu_ucx sets y
  echo "needs $need GPUs (P: $TP_P, D: $TP_D) and this machine has $NGPU: P and D would share a GPU, \
and with UCX_CUDA_IPC_ENABLE_GET_ZCOPY=${UCX_CUDA_IPC_ENABLE_GET_ZCOPY:-} UCX moves KV between two processes on one GPU at \
0.1-0.4 GB/s, so the TTFT would measure that path, not the connector (unset it: the bench sets y on a shared GPU)"
  return 1
}

# ---------------------------------------------------------------- ports -----------------------
port_in_use() { (: <>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

require_ports_free() {
  local p who
  for p in "$@"; do
    if port_in_use "$p"; then
      who=$(command -v ss >/dev/null && ss -ltnp 2>/dev/null | grep -E "[:.]$p\b" | head -n1 || true)
      die "$EXIT_SETUP" "port $p is in use${who:+ ($who)}. Stop that process or set PORT_P/PORT_D/PORT_PROXY/SIDE_P/SIDE_D."
    fi
  done
}

http_ok() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -m 5 -o /dev/null "$1" 2>/dev/null
  else
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$1" 2>/dev/null
  fi
}

# ---------------------------------------------------------------- configurations --------------
# stock      NixlConnector as shipped
# shim       ENABLE_XLKV=true on P and D (xlkv_autopatch from this checkout)
# native     vLLM's own best cross-layer configuration, without the shim:
#            0.16-0.28 kv_connector_extra_config.enable_cross_layers_blocks;
#            0.29+     VLLM_KV_CACHE_LAYOUT=BLNHC on P and D (block-outermost KV layout)
# stock-v1   stock with VLLM_USE_V2_MODEL_RUNNER=0 (0.22-0.28): the shim runs the V1 model runner
#            there, so this separates the runner from the layout in a comparison with shim
# native-v1  the opt-in with VLLM_USE_V2_MODEL_RUNNER=0 (0.22-0.28: Model Runner V2, the
#            default there, ignores the opt-in)
# nc-<cfg>   negative control (equivalence only): <cfg>, and D corrupts the KV it received
#            (experiments/negative_control/, on D's PYTHONPATH only; NC_CORRUPTION says how)
# config_supported CONFIG -> prints why not and returns 1 when the release lacks it.
config_supported() {
  case "$1" in
    stock|prefill_only) return 0 ;;
    shim) shim_supported ;;
    native) release_gate native ;;
    native-v1|stock-v1) release_gate runner-v1 || { echo "$1: only meaningful where that default is"; return 1; } ;;
    shim-keep-order|shim-ucx|shim-ids) shim_supported ;;
    shim-ray)
      if ! "$PY" -c 'import ray' 2>/dev/null; then
        echo "shim-ray: ray is not importable here (build the bundle with XLKV_BUNDLE_EXTRA=ray)"; return 1
      fi
      shim_supported ;;
    nc-*) config_supported "${1#nc-}" ;;
    *) echo "unknown config '$1' (stock, shim, shim-keep-order, shim-ucx, shim-ray, shim-ids, native, native-v1, stock-v1, nc-<config>)"; return 1 ;;
  esac
}

# release_gate NAME: true when the staged vLLM ($VLLM_VERSION) has NAME (native, layouts, runner-v1),
# else prints why not: pdtools/gates.py reads the shim's release table (no version typed here).
release_gate() { pdtools gate "$1" "${VLLM_VERSION:-0}"; }

# Does the shim support the staged vLLM?  Asks `python -m xlkv_autopatch status --json` with
# the flag on.  From a source checkout neither the .pth hook nor the plugin entry point is
# installed (sitecustomize.py activates it), so that "problem" is not held against it: the
# release must be in the supported range and at least one patch set must apply without
# errors.  SHIM_CHECK=0 skips the check (tests with a fake vLLM).
shim_supported() {
  [ "${SHIM_CHECK:-1}" = 0 ] && return 0
  local js rc=0 verdict
  js=$(cd "$REPO_DIR" && ENABLE_XLKV=true "$PY" -m xlkv_autopatch status --json 2>/dev/null) || rc=$?
  verdict=$(printf '%s' "$js" | "$PY" -c '
import json, sys
try:
    j = json.load(sys.stdin)
except ValueError:
    print("unknown"); sys.exit()
sets = [g for g in j.get("patch_sets", []) if g.get("applies")]
good = all("error" not in g and all(p.get("ok", True) for p in g.get("patches", [])) for g in sets)
print("yes" if j.get("supported") and sets and good else "no")' 2>/dev/null || echo unknown)
  if [ "$verdict" = yes ] || { [ "$verdict" = unknown ] && [ $rc -eq 0 ]; }; then return 0; fi
  echo "shim: xlkv_autopatch does not support vLLM $VLLM_VERSION here; its status says:"
  (cd "$REPO_DIR" && ENABLE_XLKV=true "$PY" -m xlkv_autopatch status 2>&1 | sed 's/^/    /') || true
  return 1
}

# Sets CFG_ENV (array of VAR=value, both servers), CFG_D_ENV (D only), CFG_D_ARGS (more
# `vllm serve` flags, D only), CFG_KV_EXTRA (JSON or empty) and CFG_PROXY_ARGS (pd_proxy.py
# flags) for a config.
NC_DIR="$EXP_DIR/negative_control"
config_env() {
  CFG_ENV=(); CFG_D_ENV=(); CFG_D_ARGS=(); CFG_KV_EXTRA=""; CFG_PROXY_ARGS=()
  case "$1" in
    stock) ;;
    shim) CFG_ENV=(ENABLE_XLKV=true) ;;
    # the shim without its descriptor ordering (XLKV_COALESCE=false): the ablation row
    shim-keep-order) CFG_ENV=(ENABLE_XLKV=true XLKV_COALESCE=false) ;;
    # the shim with more NIXL UCX threads (vLLM passes kv_connector_extra_config.num_threads to
    # nixl_agent_config; its default is 4): the ablation row of the UCX lever
    shim-ucx) CFG_ENV=(ENABLE_XLKV=true); CFG_KV_EXTRA="{\"num_threads\": ${UCX_NUM_THREADS:-8}}" ;;
    # proxy-side lever (experiments only, not the shim's): D gets P's prompt token ids, not the text
    shim-ids) CFG_ENV=(ENABLE_XLKV=true); CFG_PROXY_ARGS=(--token-ids-to-d) ;;
    # the shim with D's worker on Ray (TP 1): the flag reaches the Ray worker as README says
    shim-ray) CFG_ENV=(ENABLE_XLKV=true); CFG_D_ENV=(VLLM_RAY_EXTRA_ENV_VARS_TO_COPY=ENABLE_XLKV)
      CFG_D_ARGS=(--distributed-executor-backend ray) ;;
    native)
      if release_gate layouts > /dev/null; then CFG_ENV=(VLLM_KV_CACHE_LAYOUT=BLNHC)
      else CFG_KV_EXTRA='{"enable_cross_layers_blocks": "true"}'; fi ;;
    native-v1) CFG_KV_EXTRA='{"enable_cross_layers_blocks": "true"}'; CFG_ENV=(VLLM_USE_V2_MODEL_RUNNER=0) ;;
    stock-v1) CFG_ENV=(VLLM_USE_V2_MODEL_RUNNER=0) ;;
    nc-*)
      config_env "${1#nc-}"
      # the hook's sitecustomize.py goes first on D's PYTHONPATH and chains to the next one
      # (the checkout's, which turns the shim on where ENABLE_XLKV is set)
      CFG_D_ENV=(PYTHONPATH="$NC_DIR:$PYTHONPATH" XLKV_NEGATIVE_CONTROL="${NC_CORRUPTION:-shift}") ;;
    *) die "$EXIT_SETUP" "unknown config $1" ;;
  esac
}

# ---------------------------------------------------------------- processes -------------------
PIDS=(); PNAMES=(); PLOGS=()
COMMANDS_FILE="$WORK/commands.txt"

# start_server NAME CONFIG PORT SIDE_PORT GPUS TP LOG
start_server() {
  local name=$1 cfg=$2 port=$3 side=$4 gpus=$5 tp=$6 logf=$7
  config_env "$cfg"
  local kvcfg='{"kv_connector":"NixlConnector","kv_role":"kv_both"'
  if [ -n "$CFG_KV_EXTRA" ]; then kvcfg+=",\"kv_connector_extra_config\":$CFG_KV_EXTRA"; fi
  kvcfg+='}'
  local -a envs=(CUDA_VISIBLE_DEVICES="$gpus" VLLM_NIXL_SIDE_CHANNEL_PORT="$side" UCX_NET_DEVICES=all)
  # shared GPU: cuda_ipc READs on (shared_gpu_ucx); named here so the commands file shows it
  if [ "${SHARED_GPU:-0}" = 1 ] && [ -n "${UCX_CUDA_IPC_ENABLE_GET_ZCOPY:-}" ]; then
    envs+=(UCX_CUDA_IPC_ENABLE_GET_ZCOPY="$UCX_CUDA_IPC_ENABLE_GET_ZCOPY")
  fi
  # Releases before 0.29 need the HND layout for NIXL (and for the cross-layer path).
  if ! release_gate layouts > /dev/null; then envs+=(VLLM_KV_CACHE_LAYOUT="${KV_LAYOUT:-HND}"); fi
  envs+=("${CFG_ENV[@]}")
  case "$name" in D*)
    envs+=("${CFG_D_ENV[@]}")
    # the registration report (every config, stock too): the negative-control folder's import
    # hook on D's PYTHONPATH (nc-* configs have it there already) reads what vLLM registered
    D_REG_REPORT=""
    if [ "$REG_REPORT" = 1 ]; then
      D_REG_REPORT="${logf%.log}-registration.json"
      rm -f "$D_REG_REPORT"
      case " ${CFG_D_ENV[*]} " in *" PYTHONPATH=$NC_DIR:"*) ;; *) envs+=(PYTHONPATH="$NC_DIR:$PYTHONPATH") ;; esac
      envs+=(XLKV_REGISTRATION_REPORT="$D_REG_REPORT")
    fi ;;
  esac
  local -a cmd=("$PY" -m vllm.entrypoints.cli.main serve "$MODEL" --host 127.0.0.1 --port "$port"
    --enforce-eager --block-size "$BLOCK_SIZE" --gpu-memory-utilization "$MEM_UTIL"
    --max-model-len "$MAX_MODEL_LEN" --kv-transfer-config "$kvcfg")
  if [ "$tp" -gt 1 ]; then cmd+=(--tensor-parallel-size "$tp"); fi
  # shellcheck disable=SC2206
  if [ -n "$SERVE_EXTRA_ARGS" ]; then cmd+=($SERVE_EXTRA_ARGS); fi
  case "$name" in D*) cmd+=("${CFG_D_ARGS[@]}") ;; esac
  printf '%s: %s %s\n' "$name" "${envs[*]}" "${cmd[*]}" >> "$COMMANDS_FILE"
  log "start $name ($cfg) on :$port, GPUs [$gpus], log $logf"
  # setsid: own process group, so stop_all also ends the engine-core and worker children.
  setsid env "${envs[@]}" "${cmd[@]}" > "$logf" 2>&1 < /dev/null &
  PIDS+=($!); PNAMES+=("$name"); PLOGS+=("$logf")
}

# wait_ready NAME URL PID LOG [TIMEOUT]: polls URL until it answers 200.
wait_ready() {
  local name=$1 url=$2 pid=$3 logf=$4 timeout=${5:-$READY_TIMEOUT}
  local t0=$SECONDS
  while ! http_ok "$url"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "---- last 60 lines of $logf ----" >&2; tail -n 60 "$logf" >&2
      die "$EXIT_SETUP" "$name exited before it was ready (see $logf)"
    fi
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
      echo "---- last 60 lines of $logf ----" >&2; tail -n 60 "$logf" >&2
      die "$EXIT_SETUP" "$name did not answer $url within ${timeout}s (see $logf)"
    fi
    sleep 2
  done
  log "$name ready after $((SECONDS - t0))s"
}

# start_pair CONFIG TAG: P, D and the proxy; logs under $WORK/TAG-{p,d,proxy}.log.
start_pair() {
  local cfg=$1 tag=$2
  require_ports_free "$PORT_P" "$PORT_D" "$PORT_PROXY" "$SIDE_P" "$SIDE_D"
  assign_gpus
  P_LOG="$WORK/$tag-p.log"; D_LOG="$WORK/$tag-d.log"; PROXY_LOG="$WORK/$tag-proxy.log"
  start_server "P[$cfg]" "$cfg" "$PORT_P" "$SIDE_P" "$P_GPUS" "$TP_P" "$P_LOG"
  local ppid=${PIDS[-1]}
  # On a shared GPU, vLLM's memory profiling of one instance must not see the other one
  # still growing: start them one after the other.
  if [ "$SHARED_GPU" = 1 ]; then wait_ready "P[$cfg]" "http://127.0.0.1:$PORT_P/health" "$ppid" "$P_LOG"; fi
  start_server "D[$cfg]" "$cfg" "$PORT_D" "$SIDE_D" "$D_GPUS" "$TP_D" "$D_LOG"
  local dpid=${PIDS[-1]}
  wait_ready "P[$cfg]" "http://127.0.0.1:$PORT_P/health" "$ppid" "$P_LOG"
  wait_ready "D[$cfg]" "http://127.0.0.1:$PORT_D/health" "$dpid" "$D_LOG"
  start_proxy
  case "$cfg" in shim*|nc-shim*) check_shim_active "$P_LOG" "$D_LOG" ;; esac
  case "$cfg" in nc-*) check_negative_control_active "$D_LOG" ;; esac
}

# restart_decode CONFIG TAG: keeps P of the running pair, replaces D and the proxy by a D with
# CONFIG's settings (logs under $WORK/TAG-{d,proxy}.log).  For a negative control right after
# its own config: P is the same, and one server start-up is saved (two on a shared GPU, where
# a pair starts one server after the other).
restart_decode() {
  local cfg=$1 tag=$2 i pid t0
  local -a keep_p=() keep_n=() keep_l=()
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    case "${PNAMES[$i]}" in
      D\[*|proxy) pid=${PIDS[$i]}
        if kill -0 "$pid" 2>/dev/null; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
        t0=$SECONDS
        while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$STOP_TIMEOUT" ]; do sleep 1; done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || true; fi ;;
      *) keep_p=("${PIDS[$i]}" "${keep_p[@]}"); keep_n=("${PNAMES[$i]}" "${keep_n[@]}")
         keep_l=("${PLOGS[$i]}" "${keep_l[@]}") ;;
    esac
  done
  PIDS=("${keep_p[@]}"); PNAMES=("${keep_n[@]}"); PLOGS=("${keep_l[@]}")
  t0=$SECONDS
  while { port_in_use "$PORT_D" || port_in_use "$PORT_PROXY" || port_in_use "$SIDE_D"; } &&
        [ $((SECONDS - t0)) -lt 30 ]; do sleep 1; done
  require_ports_free "$PORT_D" "$PORT_PROXY" "$SIDE_D"
  log "restarting D as $cfg (P kept)"
  D_LOG="$WORK/$tag-d.log"; PROXY_LOG="$WORK/$tag-proxy.log"
  start_server "D[$cfg]" "$cfg" "$PORT_D" "$SIDE_D" "$D_GPUS" "$TP_D" "$D_LOG"
  wait_ready "D[$cfg]" "http://127.0.0.1:$PORT_D/health" "${PIDS[-1]}" "$D_LOG"
  start_proxy
  case "$cfg" in nc-*) check_negative_control_active "$D_LOG" ;; esac
}

start_proxy() {  # after start_server: the config's CFG_PROXY_ARGS
  setsid "$PY" "$EXP_DIR/pd_proxy.py" --port "$PORT_PROXY" --prefill "http://127.0.0.1:$PORT_P" \
    --decode "http://127.0.0.1:$PORT_D" "${CFG_PROXY_ARGS[@]}" > "$PROXY_LOG" 2>&1 < /dev/null &
  PIDS+=($!); PNAMES+=("proxy"); PLOGS+=("$PROXY_LOG")
  wait_ready proxy "http://127.0.0.1:$PORT_PROXY/health" "${PIDS[-1]}" "$PROXY_LOG" 60
}

# The shim logs "xlkv_autopatch: <patch> is active in this process" when it patches.
check_shim_active() {
  local f missing=0
  for f in "$@"; do
    if ! grep -Eq "$XLKV_ACTIVE_RE" "$f"; then
      log "WARNING: no line matching /$XLKV_ACTIVE_RE/ in $f: is the shim active there?"; missing=1
    fi
  done
  return 0 # the descriptor count is the real proof; this is only a hint
}

# The negative-control hook logs "xlkv negative control: armed" in D when it loaded.
check_negative_control_active() {
  if ! grep -q "xlkv negative control: armed" "$1"; then
    log "WARNING: the negative-control hook did not load in D ($1)"; return 0
  fi
}

# Stops everything started here (process groups), newest first, and waits for the ports.
stop_all() {
  local i pid
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    pid=${PIDS[$i]}
    if kill -0 "$pid" 2>/dev/null; then kill -TERM -- "-$pid" 2>/dev/null || true; fi
  done
  local t0=$SECONDS
  for pid in "${PIDS[@]}"; do
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$STOP_TIMEOUT" ]; do sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
  done
  # engine-core processes can outlive their parent for a moment; give the ports back
  t0=$SECONDS
  while { port_in_use "$PORT_P" || port_in_use "$PORT_D" || port_in_use "$PORT_PROXY"; } &&
        [ $((SECONDS - t0)) -lt 30 ]; do sleep 1; done
  if [ ${#PIDS[@]} -gt 0 ]; then log "stopped ${PNAMES[*]}"; fi
  PIDS=(); PNAMES=(); PLOGS=()
}

on_exit() {
  local rc=$?
  trap - EXIT
  stop_all || true
  exit $rc
}
install_traps() {
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# ---------------------------------------------------------------- model -----------------------
# model_dir_for ARCH: where the generated model of a family lives (qwen3: the old place)
model_dir_for() { if [ "$1" = qwen3 ]; then echo /tmp/xlkv-model; else echo "/tmp/xlkv-model-$1"; fi; }

# Uses $MODEL when given; otherwise generates the random model of MODEL_ARCH once.
# Sets MODEL_FAMILY (dense, mla, sliding-hybrid: pdtools model-family) and BYTES_PER_BLOCK (the
# dense K/V formula; 0 for a non-dense model, whose bytes per block id come from D's
# registration report only: use_registration below).
ensure_model() {
  if [ -n "${MODEL:-}" ]; then
    [ -f "$MODEL/config.json" ] || die "$EXIT_SETUP" "MODEL=$MODEL has no config.json"
  else
    MODEL=$(model_dir_for "$MODEL_ARCH")
    # make_model.py returns at once when $MODEL holds a model made with the same settings
    # (its .complete marker), and rewrites one made otherwise (e.g. before --init varied)
    PYTHONPATH="" "$PY" "$EXP_DIR/make_model.py" "$MODEL" --arch "$MODEL_ARCH" >&2 || die "$EXIT_SETUP" "make_model.py failed"
  fi
  export MODEL
  MODEL_FAMILY=$(pdtools model-family "$MODEL")
  local tp=$((TP_P > TP_D ? TP_P : TP_D))
  BYTES_PER_BLOCK=$(pdtools block-bytes "$MODEL" --block-size "$BLOCK_SIZE" --tp "$tp" 2>/dev/null)
  DENSE_BYTES_PER_BLOCK=$BYTES_PER_BLOCK
  export BYTES_PER_BLOCK MODEL_FAMILY
  log "model $MODEL ($MODEL_FAMILY)"
}

# use_registration: after D is ready, BYTES_PER_BLOCK from D's registration report
# ($D_REG_REPORT, start_server): the bytes one block id moves as vLLM registered them.  Without
# a report, a dense model keeps the dense formula (said in the log); a non-dense one gets 0
# (blocks per transfer and descriptors per block then stay unknown, never wrong).
use_registration() {
  local bpb=""
  if [ -n "${D_REG_REPORT:-}" ] && [ -f "$D_REG_REPORT" ]; then
    bpb=$(pdtools block-bytes-registered "$D_REG_REPORT") || bpb=""
  fi
  if [ -n "$bpb" ] && [ "$bpb" != 0 ]; then
    BYTES_PER_BLOCK=$bpb; BPB_SOURCE=registration
    log "bytes per block id: $bpb (D's registration report $(basename "$D_REG_REPORT"))"
  elif [ "${MODEL_FAMILY:-dense}" = dense ] && [ "${DENSE_BYTES_PER_BLOCK:-0}" != 0 ]; then
    BYTES_PER_BLOCK=$DENSE_BYTES_PER_BLOCK; BPB_SOURCE="dense formula"
    log "NOTE: no usable registration report from D${D_REG_REPORT:+ ($D_REG_REPORT)}: bytes per block from the dense K/V formula ($BYTES_PER_BLOCK)"
  else
    BYTES_PER_BLOCK=0; BPB_SOURCE=none
    log "WARNING: no usable registration report from D${D_REG_REPORT:+ ($D_REG_REPORT)} for a $MODEL_FAMILY model: blocks per transfer unknown"
  fi
  export BYTES_PER_BLOCK
}

# fragmenting_load URL N OUT_LEN LOG: the churning load that fragments the free block queues
# (pd_bench.sh BENCH_STATE=fragmented, pd_equivalence.sh EQ_FRAGMENT): N random prompts of
# FRAG_LEN x [0.1, 1.9] tokens (seed 77), OUT_LEN output tokens each, all sent at once to URL.
# The command goes to $COMMANDS_FILE; on failure the log's tail goes to stderr and it returns 1.
fragmenting_load() {
  local url=$1 n=$2 out_len=$3 logf=$4
  local -a cmd=("$PY" -m vllm.entrypoints.cli.main bench serve --backend vllm --model "$MODEL"
    --tokenizer "$MODEL" --base-url "$url" --endpoint /v1/completions
    --dataset-name random --random-input-len "${FRAG_LEN:?}" --random-output-len "$out_len"
    --random-range-ratio 0.9 --num-prompts "$n" --seed 77 --ignore-eos)
  echo "fragment: ${cmd[*]}" >> "$COMMANDS_FILE"
  timeout "${FRAG_TIMEOUT:-900}" "${cmd[@]}" > "$logf" 2>&1 || { tail -n 30 "$logf" >&2; return 1; }
  grep -E "Successful requests|Failed requests" "$logf" | sed 's/^/    /' >&2 || true
}

# kv_log_offset FILE: byte size now (where the next run's metrics lines start).
kv_log_offset() { stat -c %s "$1" 2>/dev/null || echo 0; }

# wait_kv_lines LOG OFFSET: waits until a "KV Transfer metrics" line follows OFFSET, then two
# more logging intervals and a margin, so the final interval of the run is in the file.
wait_kv_lines() {
  local logf=$1 off=$2 t0=$SECONDS limit=${KV_WAIT:-60}
  until tail -c +"$((off + 1))" "$logf" | grep -q "KV Transfer metrics:"; do
    if [ $((SECONDS - t0)) -ge "$limit" ]; then
      log "WARNING: no KV Transfer metrics line in $logf within ${limit}s"; return 1
    fi
    sleep 0.2
  done
  # two more logging intervals (the lines of transfers still in flight), and a margin of one more
  # interval up to 1 s: 7 s at vLLM's 3 s, 0.6 s at the tests' fake 0.2 s
  sleep "$(awk -v i="${VLLM_LOG_STATS_INTERVAL:-3}" 'BEGIN { printf "%.2f", 2 * i + (i < 1 ? i : 1) }')"
}

# Tails of every log of this run into one file (for $OUT).
collect_log_tails() {
  local dest=$1 f
  : > "$dest"
  for f in "$WORK"/*.log; do
    [ -f "$f" ] || continue
    { echo "==== $f (last ${TAIL_LINES:-80} lines) ===="; tail -n "${TAIL_LINES:-80}" "$f"; echo; } >> "$dest"
  done
}
