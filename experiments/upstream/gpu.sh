#!/usr/bin/env bash
# vLLM's own NIXL unit tests on a lent GPU machine (no network there): stock vs ENABLE_XLKV=true.
#
#   here:  bash experiments/upstream/gpu.sh pack DIR RELEASE...
#            DIR/up.tar.zst: the test dependencies the GPU image lacks (tblib; ray without its
#            jars: test_nixl_connector.py imports it), as Python 3.12 wheels unpacked, and each
#            release's tests/ tree (fetched and sha256-checked by upstream_tests.py fetch)
#   here:  bash experiments/upstream/gpu.sh pack-shim DIR [COMMIT]
#            DIR/shim.tar: the shim as committed (git archive of xlkv_autopatch/ and
#            sitecustomize.py at COMMIT, default HEAD; .xlkv-commit names it), so that what runs
#            there is a commit, not a working tree other work is changing
#   there: bash experiments/upstream/gpu.sh unpack DIR        -> /tmp/up/{site,trees/vllm-R,shim}
#   there: bash experiments/upstream/gpu.sh run RELEASE WHERE [N]
#            with the release's vLLM bundle in $SITE (experiments/bundle.sh setup): the stock and
#            the flag-on runs side by side, each under pytest-xdist with N workers (default 4),
#            then `compare`; $OUT/upstream-tests-RELEASE-WHERE.json (+ the console tails).
#            UPSTREAM_FILES="a.py b.py" runs only those files (resume a cut run with the rest);
#            UPSTREAM_MODES="stock on" (add "off" for the installed-but-off mode).
# The shim travels as shim.tar: the flag-on run puts /tmp/up/shim on PYTHONPATH, where its
# sitecustomize.py activates it; the stock run hides it (xlkv_upstream_probe.py).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
TOOL="$HERE/upstream_tests.py"
UP=${UP:-/tmp/up}
cmd=${1:?usage: gpu.sh pack DIR RELEASE... | unpack DIR | run RELEASE WHERE [N]}
shift

case "$cmd" in
pack)
  dir=${1:?DIR}; shift
  [ $# -gt 0 ] || { echo "name at least one release" >&2; exit 2; }
  work=$(mktemp -d)
  mkdir -p "$work/up/site" "$work/up/trees" "$dir"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
    -d "$work/wheels" "tblib==3.1.0" "ray==2.48.0"
  for w in "$work"/wheels/*.whl; do python3 -m zipfile -e "$w" "$work/up/site"; done
  rm -rf "$work/up/site/ray/jars"
  for rel in "$@"; do
    tree=$(python3 "$TOOL" fetch "$rel" 2>/dev/null | tail -1)
    cp -a "$tree" "$work/up/trees/vllm-$rel"
  done
  command -v zstd >/dev/null || { apt-get update -qq && apt-get install -y -qq zstd; }
  tar -C "$work" -cf - up | zstd -q -T0 -12 > "$dir/up.tar.zst"
  rm -rf "$work"
  ls -la "$dir/up.tar.zst"
  ;;
pack-shim)
  dir=${1:?DIR}; commit=$(git -C "$REPO" rev-parse --short "${2:-HEAD}")
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  git -C "$REPO" archive "$commit" xlkv_autopatch sitecustomize.py | tar -C "$tmp" -xf -
  echo "$commit" > "$tmp/.xlkv-commit"
  tar -C "$tmp" -cf "$dir/shim.tar" .
  rm -rf "$tmp"
  echo "shim at $commit -> $dir/shim.tar"
  ;;
unpack)
  dir=${1:?DIR}
  if [ -f "$REPO/$dir/shim.tar" ]; then
    rm -rf "$UP/shim" && mkdir -p "$UP/shim" && tar -C "$UP/shim" -xf "$REPO/$dir/shim.tar"
    echo "shim at $(cat "$UP/shim/.xlkv-commit")"
  fi
  if [ ! -d "$UP/site/tblib" ]; then
    zs=$(ls /tmp/stage/.*/zstandard-*.whl /tmp/stage/*/zstandard-*.whl "$REPO"/.xfer*/zstandard-*.whl 2>/dev/null \
      | head -1 || true)
    [ -n "$zs" ] || { echo "no zstandard wheel staged (bundle.sh stage carries one)" >&2; exit 2; }
    python3 -m pip install -q --no-index --no-deps --target /tmp/zs "$zs"
    PYTHONPATH=/tmp/zs python3 -c "
import sys, tarfile, zstandard
r = zstandard.ZstdDecompressor().stream_reader(open(sys.argv[1], 'rb'))
tarfile.open(fileobj=r, mode='r|').extractall('/tmp')
" "$REPO/$dir/up.tar.zst"
  fi
  ls "$UP/trees"
  ;;
run)
  rel=${1:?RELEASE}; where=${2:?WHERE e.g. 1xH100}; n=${3:-4}
  SITE=${SITE:-/tmp/site}
  OUT=${OUT:-/tmp/up/out}
  mkdir -p "$OUT" /tmp/up/runs
  export XLKV_UPSTREAM_CACHE="$UP/trees"
  export PYTHONPATH="$SITE:$UP/site${PYTHONPATH:+:$PYTHONPATH}"
  export VLLM_USE_FLASHINFER_SAMPLER=0
  files=()
  [ -n "${UPSTREAM_FILES:-}" ] && files=(--files $UPSTREAM_FILES)
  res="$OUT/upstream-tests-$rel-$where.json"
  pids=()
  base=6000
  for mode in ${UPSTREAM_MODES:-stock on}; do
    base=$((base + 200))
    part="/tmp/up/runs/$rel-$where-$mode-$(date +%H%M%S).json"
    VLLM_NIXL_SIDE_CHANNEL_PORT=$base VLLM_PORT=$((base + 100)) \
      python3 "$TOOL" run "$rel" --python "${UPSTREAM_PYTHON:-python3}" --mode "$mode" --out "$part" --where "$where" \
        --shim-path "$UP/shim" "${files[@]}" --timeout "${UPSTREAM_TIMEOUT:-540}" \
        --pytest-args "-n $n --dist load -p no:randomly" > "/tmp/up/runs/$mode.log" 2>&1 &
    pids+=("$!:$mode:$part")
  done
  rc=0
  parts=()
  for p in "${pids[@]}"; do
    pid=${p%%:*}; rest=${p#*:}; mode=${rest%%:*}; part=${rest#*:}
    if wait "$pid"; then parts+=("$part"); else echo "mode $mode failed:"; rc=1; fi
    tail -5 "/tmp/up/runs/$mode.log"
    cp "/tmp/up/runs/$mode.log" "$OUT/console-$rel-$mode.txt" 2>/dev/null || true
  done
  [ ${#parts[@]} -gt 0 ] && python3 "$TOOL" merge "$res" "${parts[@]}"
  [ -f "$res" ] && { python3 "$TOOL" compare "$res" || rc=1; }
  exit $rc
  ;;
*)
  echo "unknown command $cmd" >&2; exit 2 ;;
esac
