#!/usr/bin/env bash
# Moving a vLLM bundle (built by ../shared/gpu/build_bundle.sh VERSION DIR) to a GPU machine.
#
#   bundle.sh manifest DIR VERSION   here: write DIR/MANIFEST (version, chunk names, sha256)
#   bundle.sh stage DIR              GPU machine, once per carried chunk: copy DIR/p*, the
#                                    zstandard wheel and MANIFEST into /tmp/stage/<DIR>/
#   bundle.sh setup DIR              GPU machine, after the last chunk: check every chunk
#                                    against MANIFEST, unpack into $SITE (/tmp/site)
#   bundle.sh check                  is a vLLM in $SITE importable? (prints versions)
#
# One device call carries at most 64 MiB, so chunks travel one per call, calls back to back
# (/tmp survives only while the machine stays warm).  DIR is the bundle folder relative to
# the repository root (.xfer21, .xfer26).  Chunks of two bundles never mix: each has its own
# /tmp/stage/<DIR>/, and setup replaces a $SITE that holds another vLLM release.
set -euo pipefail
SITE=${SITE:-/tmp/site}
STAGE_ROOT=${STAGE_ROOT:-/tmp/stage}
cmd=${1:?usage: bundle.sh manifest|stage|setup|check [DIR] [VERSION]}
dir=${2:-}

site_version() {
  PYTHONPATH="$SITE" python3 -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || true
}

case "$cmd" in
manifest)
  ver=${3:?version}
  [ -d "$dir" ] || { echo "no bundle folder $dir" >&2; exit 2; }
  ( cd "$dir"
    { echo "version $ver"
      for f in $(ls p* | sort); do echo "chunk $f $(sha256sum "$f" | cut -d' ' -f1)"; done
      for f in zstandard-*.whl; do if [ -f "$f" ]; then echo "wheel $f $(sha256sum "$f" | cut -d' ' -f1)"; fi; done
    } > MANIFEST )
  cat "$dir/MANIFEST"
  ;;
stage)
  [ -n "$dir" ] || { echo "usage: bundle.sh stage DIR" >&2; exit 2; }
  dest="$STAGE_ROOT/$(basename "$dir")"
  mkdir -p "$dest"
  n=0
  for f in "$dir"/p* "$dir"/zstandard-*.whl "$dir"/MANIFEST; do
    [ -f "$f" ] || continue
    cp "$f" "$dest/" && n=$((n + 1))
    if [ -f "$dir/MANIFEST" ] && [ "$(basename "$f")" != MANIFEST ]; then
      want=$(awk -v n="$(basename "$f")" '$2 == n {print $3}' "$dir/MANIFEST")
      got=$(sha256sum "$dest/$(basename "$f")" | cut -d' ' -f1)
      if [ -n "$want" ] && [ "$want" != "$got" ]; then echo "CHECKSUM MISMATCH: $f" >&2; exit 2; fi
    fi
    echo "staged $f"
  done
  [ $n -gt 0 ] || { echo "nothing to stage in $dir (carry $dir/p<N>)" >&2; exit 2; }
  echo "in $dest now: $(cd "$dest" && ls | xargs)"
  ;;
setup)
  [ -n "$dir" ] || { echo "usage: bundle.sh setup DIR" >&2; exit 2; }
  src="$STAGE_ROOT/$(basename "$dir")"
  [ -d "$src" ] || { echo "nothing staged in $src" >&2; exit 2; }
  cd "$src"
  want_ver=""
  if [ -f MANIFEST ]; then
    want_ver=$(awk '$1 == "version" {print $2}' MANIFEST)
    missing=0
    while read -r kind name sum; do
      [ "$kind" = chunk ] || [ "$kind" = wheel ] || continue
      if [ ! -f "$name" ]; then echo "MISSING: $name (stage it: carry $dir/$name)" >&2; missing=1
      elif [ "$(sha256sum "$name" | cut -d' ' -f1)" != "$sum" ]; then echo "CORRUPT: $name" >&2; missing=1; fi
    done < MANIFEST
    [ $missing = 0 ] || exit 2
  fi
  have=$(site_version)
  if [ -n "$have" ] && { [ -z "$want_ver" ] || [ "$have" = "$want_ver" ]; }; then
    echo "$SITE already holds vLLM $have"
  else
    [ -z "$have" ] || echo "replacing vLLM $have in $SITE by $want_ver"
    rm -rf "$SITE" /tmp/zs && mkdir -p "$SITE"
    python3 -m pip install -q --no-index --no-deps --target /tmp/zs zstandard-*.whl
    # the chunks are one zstd-compressed tar, split: join them in name order and unpack
    cat $(ls p* | sort) | PYTHONPATH=/tmp/zs python3 -c '
import sys, tarfile, zstandard
stream = zstandard.ZstdDecompressor().stream_reader(sys.stdin.buffer)
tarfile.open(fileobj=stream, mode="r|").extractall(sys.argv[1])
' "$SITE"
  fi
  exec bash "$0" check
  ;;
check)
  PYTHONPATH="$SITE" VLLM_USE_FLASHINFER_SAMPLER=0 python3 -c '
import importlib.metadata as m, torch
import nixl._api  # noqa: F401
print("vllm", m.version("vllm"), "nixl ok", "torch", torch.__version__, "gpus", torch.cuda.device_count())'
  ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
