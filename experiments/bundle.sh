#!/usr/bin/env bash
# Building a vLLM bundle here and moving it to a GPU machine (no network there).
#
#   bundle.sh build VERSION DIR      here: download vLLM VERSION, what it needs that the GPU image
#                                    lacks (and, when the release pins another torch than the
#                                    image's, that torch + its triton/torchvision + the CUDA
#                                    libraries in XLKV_BUNDLE_LIBS); pack it as one zstd tar
#                                    split into <= CHUNK_MB chunks DIR/p<NN>; write DIR/MANIFEST
#   bundle.sh build-libs TORCH DIR LIB...
#                                    here: a second bundle holding only CUDA wheels (a bare name
#                                    takes the version torch TORCH pins): for a carried CUDA-12
#                                    torch, whose libraries the CUDA-13 image lacks, kept apart so
#                                    that a missing library costs a few chunks, not a rebuild
#   bundle.sh pack SITE DIR VERSION  here: only the packing step of build (a site folder -> chunks)
#   bundle.sh manifest DIR VERSION   here: (re)write DIR/MANIFEST (version, chunk names, sha256)
#   bundle.sh rechunk DIR            here: cut DIR's chunks anew at CHUNK_MB (or CHUNK_BYTES), the
#                                    same bytes, and rewrite MANIFEST: for when the tracked tree
#                                    plus a chunk outgrows the 64 MiB a device call carries
#   bundle.sh stage DIR              GPU machine, once per carried chunk: copy DIR/p*, the
#                                    zstandard wheel and MANIFEST into /tmp/stage/<DIR>/
#   bundle.sh setup DIR              GPU machine, after the last chunk: check every chunk
#                                    against MANIFEST, unpack into $SITE (/tmp/site), then try
#                                    `import torch` and `import vllm._C` (or vllm._C_stable_libtorch) (the ImportError names
#                                    a missing library) and print versions
#   bundle.sh add DIR                GPU machine, after setup of the main bundle: check DIR's
#                                    staged chunks and unpack them into the same $SITE (a
#                                    build-libs bundle), then the same import checks
#   bundle.sh check                  is a vLLM in $SITE importable? (prints versions)
#
# One device call carries at most 64 MiB, so chunks travel one per call, calls back to back
# (/tmp survives only while the machine stays warm).  DIR is the bundle folder relative to
# the repository root (.xfer26, .xfer33).  Chunks of two bundles never mix: each has its own
# /tmp/stage/<DIR>/, and setup replaces a $SITE that holds another vLLM release.
#
# A carried torch lies in $SITE itself, next to vLLM: every user puts $SITE on PYTHONPATH,
# which comes before the image's site-packages, so $SITE's torch/triton win.  torch finds its
# CUDA libraries by searching sys.path for nvidia/<lib>/lib, in sys.path order: a carried
# library ($SITE/nvidia/nccl/lib) wins, every other one comes from the image.
#
# Build settings (environment):
#   XLKV_BUNDLE_LIBS   CUDA wheels to carry with a carried torch (default: nvidia-nccl-cu13,
#                      see experiments/README.md "Bundles for torch-2.13/2.14 releases").
#                      A bare name takes the version that torch pins; NAME==VER is taken as
#                      is; "none" carries none.  E.g. XLKV_BUNDLE_LIBS="nvidia-nccl-cu13
#                      nvidia-cudnn-cu13" after `setup` named libcudnn.
#   XLKV_BUNDLE_IMAGE  the GPU image's packages (default experiments/build_bundle_image.txt)
#   XLKV_BUNDLE_SKIP   extra regex of package names to leave out
#   XLKV_BUNDLE_RESOLVE image packages to resolve by vLLM's pins and carry instead of the
#                      image's (e.g. "transformers tokenizers huggingface-hub" for 0.12-0.19)
#   XLKV_BUNDLE_NIXL   NIXL wheel (default nixl-cu13; nixl-cu12 when the carried torch is a
#                      CUDA-12 build)
#   XLKV_BUNDLE_EXTRA  extra requirements resolved with vLLM's (e.g. "ray[cgraph]" for
#                      --distributed-executor-backend ray); less the image's packages as well
#   XLKV_BUNDLE_NODEPS wheels carried without resolving their requirements (e.g. "ai-dynamo==1.6.1",
#                      which asks for a release of aisimulate that PyPI does not have; its other
#                      requirements go in XLKV_BUNDLE_EXTRA)
#   CHUNK_MB (55; CHUNK_BYTES overrides), ZSTD_LEVEL (12), BUNDLE_WORK (.xfer-tmp/build-VERSION; deleted at the end
#   unless KEEP_WORK=1)
set -euo pipefail
SITE=${SITE:-/tmp/site}
STAGE_ROOT=${STAGE_ROOT:-/tmp/stage}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmd=${1:?usage: bundle.sh build|manifest|stage|setup|check [DIR|VERSION] [VERSION|DIR]}
dir=${2:-}
PY=${PYTHON:-python3}

site_version() {
  PYTHONPATH="$SITE" "$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || true
}

# DIR/MANIFEST: "version V", "torch V" (when carried), "carry NAME==V" (informational),
# "chunk NAME SHA256", "wheel NAME SHA256"
write_manifest() {  # DIR VERSION [HEADER_FILE: torch/carry lines; default: the old MANIFEST's]
  local d=$1 ver=$2 hdr=${3:-} extra
  [ -d "$d" ] || { echo "no bundle folder $d" >&2; exit 2; }
  if [ -n "$hdr" ]; then extra=$(grep -E '^(torch|carry|libs) ' "$hdr" || true)
  else extra=$(grep -E '^(torch|carry|libs) ' "$d/MANIFEST" 2>/dev/null || true); fi
  ( cd "$d"
    { echo "version $ver"
      [ -z "$extra" ] || echo "$extra"
      for f in $(ls p* | sort); do echo "chunk $f $(sha256sum "$f" | cut -d' ' -f1)"; done
      for f in zstandard-*.whl; do if [ -f "$f" ]; then echo "wheel $f $(sha256sum "$f" | cut -d' ' -f1)"; fi; done
    } > MANIFEST.new && mv MANIFEST.new MANIFEST )
  cat "$d/MANIFEST"
}

# ---------------------------------------------------------------------------- build (here)
PLATFORMS="manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64
  manylinux_2_18_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_31_x86_64
  manylinux_2_34_x86_64 manylinux_2_35_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any"
# Heavy packages that a FLASH_ATTN / TRITON_ATTN dense-model run never imports (flashinfer is
# left out: run with VLLM_USE_FLASHINFER_SAMPLER=0).
SKIP_DEFAULT='flashinfer-cubin|flashinfer-python|flashinfer-jit-cache|tokenspeed-triton|tokenspeed-mla|nvidia-cutlass-dsl.*|tilelang|z3-solver|cuda-tile|quack-kernels|nvidia-cudnn-frontend|fastsafetensors|instanttensor|humming-kernels|nccl-extensions|nccl4py|torch-c-dlpack-ext|supervisor|sentry-sdk|fastapi-cloud-cli|cuda-python|nvidia-cuda-cccl|nvidia-cuda-crt|nvidia-cuda-nvcc|nvidia-cuda-nvdisasm|nvidia-nvvm|pynvvideocodec|torchcodec'

pip_download() {  # DEST REQ...
  local dest=$1; shift
  local plat="" p
  for p in $PLATFORMS; do plat="$plat --platform $p"; done
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $plat -d "$dest" "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

wheel_requires() {  # WHEEL -> Requires-Dist lines without extras, markers evaluated for the GPU machine
  "$PY" - "$1" <<'EOF'
import sys, zipfile, re
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if re.match(r"[^/]+\.dist-info/METADATA$", n))
env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
       "python_version": "3.12", "implementation_name": "cpython", "os_name": "posix"}
try:
    from packaging.markers import Marker
except ImportError:
    Marker = None
for line in z.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    req, _, marker = line.split(":", 1)[1].strip().partition(";")
    if "extra" in marker:
        continue
    if marker.strip() and Marker is not None and not Marker(marker).evaluate(env):
        continue
    print(req.strip())
EOF
}

pin_of() {  # NAME < requirement lines -> the version spec (==2.14.0, ~=3.8.0) or nothing
  "$PY" -c '
import re, sys
name = re.sub(r"[-_.]+", "-", sys.argv[1]).lower()
for line in sys.stdin:
    m = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*\(?\s*([^;()]*)", line)
    if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == name:
        print(m.group(3).replace(" ", "")); break' "$1"
}

image_version() {  # NAME -> the image's version, when the image list knows it
  local n
  n=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  awk -F'==' -v n="$n" '{k=tolower($1); gsub(/[_.]/, "-", k); if (k == n && NF > 1) {print $2; exit}}' "$IMAGE_LIST"
}

# torch_pins TORCH REQUIRES SKIP_IMAGE LIB...: the CUDA wheels LIB... (build's XLKV_BUNDLE_LIBS,
# build-libs' arguments) as requirements, one a line: a bare name takes the version torch TORCH
# pins in REQUIRES (its Requires-Dist lines), NAME==VER is taken as is, "none" is skipped.  With
# SKIP_IMAGE=1 a pin the image already has is left out (said on stderr).  Returns 2 when torch
# does not pin a bare name.
torch_pins() {
  local tv=$1 requires=$2 skip_image=$3 lib spec; shift 3
  for lib in "$@"; do
    [ "$lib" != none ] || continue
    case "$lib" in
      *==*) echo "$lib" ;;
      *) spec=$(pin_of "$lib" < "$requires")
         [ -n "$spec" ] || { echo "torch $tv does not pin $lib: give $lib==VERSION" >&2; return 2; }
         if [ "$skip_image" = 1 ] && [ "${spec#==}" = "$(image_version "$lib")" ]; then
           echo "$lib$spec: the image has it, not carried" >&2
         else echo "$lib$spec"; fi ;;
    esac
  done
}

build() {
  local ver=${1:?usage: bundle.sh build VERSION DIR} out=${2:?usage: bundle.sh build VERSION DIR}
  local repo; repo=$(cd "$HERE/.." && pwd)
  IMAGE_LIST=${XLKV_BUNDLE_IMAGE:-$HERE/build_bundle_image.txt}
  local work=${BUNDLE_WORK:-$repo/.xfer-tmp/build-$ver}
  local chunk_mb=${CHUNK_MB:-55} level=${ZSTD_LEVEL:-12}
  case "$out" in /*) ;; *) out="$repo/$out" ;; esac
  git -C "$repo" check-ignore -q "$out/p00" || echo "WARNING: $out is not git-ignored (add /$(basename "$out")/ to .gitignore)" >&2
  command -v zstd >/dev/null || { echo "build needs zstd here (apt-get install zstd)" >&2; exit 2; }
  command -v uv >/dev/null || "$PY" -m pip install -q uv
  rm -rf "$work" && mkdir -p "$work/wheels" "$out"

  # 1. the vLLM wheel and what it pins
  pip_download "$work/wheels" "vllm==$ver"
  local vwheel; vwheel=$(ls "$work"/wheels/vllm-*.whl)
  wheel_requires "$vwheel" > "$work/vllm.requires"
  local torch_pin image_torch carried=("")
  torch_pin=$(pin_of torch < "$work/vllm.requires"); torch_pin=${torch_pin#==}
  image_torch=$(image_version torch)
  echo "vLLM $ver pins torch ${torch_pin:-?}; the image has torch ${image_torch:-?}"

  # 2. vLLM's dependencies for Python 3.12, less what the image has (kept lean: the image's
  #    own versions are used even where vLLM asks for newer ones, as with 0.21/0.26)
  #    XLKV_BUNDLE_RESOLVE names image packages resolved by vLLM's pins instead (and carried):
  #    0.12-0.19 want transformers < 5, the image has 5.x
  local resolve_re="^(${XLKV_BUNDLE_RESOLVE:+$(echo "$XLKV_BUNDLE_RESOLVE" | xargs | tr ' ' '|')}|XLKV_NONE)=="
  grep -viE "$resolve_re" "$IMAGE_LIST" | \
    sed -E 's/==.*//; /^\s*(#|$)/d; s/$/; sys_platform == "never"/' > "$work/overrides.txt"
  # NIXL built for torch's CUDA major: a carried CUDA-12 torch (0.12-0.19) needs nixl-cu12
  local nixl=${XLKV_BUNDLE_NIXL:-nixl-cu13}
  if [ -z "${XLKV_BUNDLE_NIXL:-}" ] && [ -n "$torch_pin" ] && [ "$torch_pin" != "$image_torch" ]; then
    pip_download "$work/wheels" "torch==$torch_pin"
    if wheel_requires "$(ls "$work"/wheels/torch-*.whl)" | grep -iE '^nvidia-[a-z_-]+-cu12' >/dev/null; then nixl=nixl-cu12; fi
  fi
  echo "NIXL: $nixl"
  printf 'vllm==%s\n%s\n' "$ver" "$nixl" > "$work/req.in"
  local x; for x in ${XLKV_BUNDLE_EXTRA:-}; do echo "$x" >> "$work/req.in"; done
  # resolve for the glibc vLLM's own wheel asks for (0.15 wheels are manylinux_2_31), at least 2.28
  local glibc
  glibc=$(basename "$vwheel" | grep -oE 'manylinux_2_[0-9]+' | sed 's/manylinux_2_//' | sort -n | tail -1)
  [ -n "$glibc" ] && [ "$glibc" -ge 28 ] || glibc=28
  uv pip compile -q "$work/req.in" --python-version 3.12 --python-platform "x86_64-manylinux_2_$glibc" \
    --override "$work/overrides.txt" -o "$work/req.txt"
  local skip="^($SKIP_DEFAULT${XLKV_BUNDLE_SKIP:+|$XLKV_BUNDLE_SKIP})(\[[^]]*\])?=="
  grep -vE '^\s*#|^\s*$' "$work/req.txt" | grep -viE "$skip" | grep -viE '^vllm==' > "$work/req.slim.txt"
  echo nixl >> "$work/req.slim.txt"   # meta package that provides `import nixl`

  # 3. torch, when the release pins another one than the image's
  if [ -n "$torch_pin" ] && [ "$torch_pin" != "$image_torch" ]; then
    [ -n "$(ls "$work"/wheels/torch-*.whl 2>/dev/null)" ] || pip_download "$work/wheels" "torch==$torch_pin"
    local twheel; twheel=$(ls "$work"/wheels/torch-*.whl)
    wheel_requires "$twheel" > "$work/torch.requires"
    local extra=("torch==$torch_pin") spec name lib libs
    spec=$(pin_of triton < "$work/torch.requires"); [ -z "$spec" ] || extra+=("triton$spec")
    for name in torchvision torchaudio; do
      spec=$(pin_of "$name" < "$work/vllm.requires")
      # the image's torchvision/torchaudio are built for its torch: carry vLLM's pin if it differs
      if [ -n "$spec" ] && [ "${spec#==}" != "$(image_version "$name")" ]; then extra+=("$name$spec"); fi
    done
    # shellcheck disable=SC2086
    libs=$(torch_pins "$torch_pin" "$work/torch.requires" 1 ${XLKV_BUNDLE_LIBS-nvidia-nccl-cu13}) || exit 2
    for lib in $libs; do extra+=("$lib"); done
    echo "carrying with torch: ${extra[*]}"
    pip_download "$work/wheels" "${extra[@]:1}"
    # MANIFEST names the versions downloaded (triton~=3.8.0 -> triton==3.8.0)
    for spec in "${extra[@]}"; do
      name=$(echo "$spec" | sed -E 's/[=~<>!].*//' | tr 'A-Z-' 'a-z_')
      w=$(ls "$work"/wheels/ | awk -F- -v n="$name" 'tolower($1) == n {print $2; exit}')
      carried+=("carry ${spec%%[=~<>!]*}==${w:-?}")
    done
    carried=("torch $torch_pin" "${carried[@]}")
  fi
  pip_download "$work/wheels" -r "$work/req.slim.txt"
  # shellcheck disable=SC2086
  [ -z "${XLKV_BUNDLE_NODEPS:-}" ] || pip_download "$work/wheels" ${XLKV_BUNDLE_NODEPS}

  # 4. unpack into one site folder (unzip keeps the executable bits: triton's ptxas)
  local site="$work/site" w d
  mkdir -p "$site"
  for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$site"; done
  for d in "$site"/*.data; do
    [ -d "$d" ] || continue
    for sub in purelib platlib; do [ -d "$d/$sub" ] && cp -a "$d/$sub/." "$site/"; done
    rm -rf "$d"
  done
  # never imported in these runs: nixl's EP builds, FA2 (FA3 on Hopper), headers, static
  # libraries, test libraries
  rm -rf "$site/nixl_ep" "$site"/nixl_ep_cu1* "$site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so" \
    "$site/vllm/third_party/deep_gemm/include" "$site/triton/instrumentation/libGPUInstrumentationTestLib.so"
  find "$site" -name '*.a' -path '*/triton/*' -delete
  find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
  local payload; payload=$(du -sm "$site" | cut -f1)

  # 5. one zstd tar, split; the zstandard wheel unpacks it on the machine (zstd may be absent)
  rm -f "$out"/zstandard-*.whl
  pip_download "$out" zstandard
  printf '%s\n' "${carried[@]}" > "$work/carried.txt"
  pack "$site" "$out" "$ver" "$work/carried.txt"
  [ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$work"
  echo "bundle $out: vLLM $ver, payload ${payload} MB unpacked"
  ls -l "$out"
  echo "chunks: $(ls "$out"/p[0-9]* | wc -l), $(du -cm "$out"/p[0-9]* | tail -1 | cut -f1) MB"
}

build_libs() {  # TORCH_VERSION DIR LIB...
  local tv=${1:?usage: bundle.sh build-libs TORCH DIR LIB...} out=${2:?DIR}; shift 2
  [ $# -gt 0 ] || { echo "name the CUDA wheels to carry" >&2; exit 2; }
  local repo; repo=$(cd "$HERE/.." && pwd)
  local work=${BUNDLE_WORK:-$repo/.xfer-tmp/libs-$tv} lib w carried=("libs for torch $tv")
  case "$out" in /*) ;; *) out="$repo/$out" ;; esac
  rm -rf "$work" && mkdir -p "$work/wheels" "$work/site" "$out"
  pip_download "$work/wheels" "torch==$tv"
  wheel_requires "$(ls "$work"/wheels/torch-*.whl)" > "$work/torch.requires"
  rm -f "$work"/wheels/torch-*.whl
  local reqs=() pins
  pins=$(torch_pins "$tv" "$work/torch.requires" 0 "$@") || exit 2
  for lib in $pins; do reqs+=("$lib"); done
  echo "carrying: ${reqs[*]}"
  pip_download "$work/wheels" "${reqs[@]}"
  for w in "$work"/wheels/*.whl; do
    unzip -q -o "$w" -d "$work/site"
    carried+=("carry $(basename "$w" | cut -d- -f1)==$(basename "$w" | cut -d- -f2)")
  done
  printf '%s\n' "${carried[@]}" > "$work/carried.txt"
  pack "$work/site" "$out" "libs-torch-$tv" "$work/carried.txt"
  [ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$work"
  echo "chunks: $(ls "$out"/p[0-9]* | wc -l), $(du -cm "$out"/p[0-9]* | tail -1 | cut -f1) MB"
}

# pack SITE_DIR OUT VERSION [HEADER_FILE]: one compressed tar of SITE_DIR split into chunks
# OUT/p00, p01, ... of at most CHUNK_BYTES (default CHUNK_MB=55 MB), then OUT/MANIFEST.
# BUNDLE_COMPRESS: zstd (default; setup needs the zstandard wheel in OUT) or xz (Python's lzma).
pack() {
  local site=$1 out=$2 ver=$3 hdr=${4:-}
  local bytes=${CHUNK_BYTES:-$(( ${CHUNK_MB:-55} * 1000 * 1000 ))}
  mkdir -p "$out"
  rm -f "$out"/p[0-9]* "$out/MANIFEST"
  case "${BUNDLE_COMPRESS:-zstd}" in
    zstd) tar -C "$site" -cf - . | zstd -q -T0 "-${ZSTD_LEVEL:-12}" | split -b "$bytes" -d -a 2 - "$out/p" ;;
    xz)   tar -C "$site" -cf - . | xz -q -T0 -6 | split -b "$bytes" -d -a 2 - "$out/p" ;;
    *) echo "BUNDLE_COMPRESS must be zstd or xz" >&2; exit 2 ;;
  esac
  write_manifest "$out" "$ver" "$hdr"
}

# ---------------------------------------------------------------------------- GPU machine
# What setup and check import, with $SITE first on PYTHONPATH (as the lab puts it:
# pdtools/settings.py server_env).  Each probe prints one line; an exception prints its type and
# message in full.
probe() {
  PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_FLASHINFER_SAMPLER=0 "$PY" - "$@" <<'EOF'
import importlib, importlib.metadata as m, sys, traceback
want_torch = sys.argv[1] if len(sys.argv) > 1 else ""
bad = 0
def step(label, fn):
    global bad
    try:
        print(f"{label}: {fn()}", flush=True)
    except BaseException as e:  # noqa: BLE001 - report everything, ImportError above all
        bad = 1
        print(f"{label}: FAILED {type(e).__name__}: {e}", flush=True)
        traceback.print_exc(limit=-3, file=sys.stdout)
def torch_line():
    import torch
    line = f"{torch.__version__} cuda_available={torch.cuda.is_available()} from {torch.__file__}"
    if want_torch and not torch.__version__.startswith(want_torch):
        raise ImportError(f"torch {torch.__version__} from {torch.__file__}, but the bundle carries {want_torch}")
    return line
step("import torch", torch_line)
def vllm_ext():
    # vLLM's main extension: vllm._C up to 0.2x, vllm._C_stable_libtorch in later releases
    import importlib.util
    for name in ("vllm._C", "vllm._C_stable_libtorch"):
        if importlib.util.find_spec(name) is not None:
            return f"{name} ok ({importlib.import_module(name).__file__})"
    raise ImportError("neither vllm._C nor vllm._C_stable_libtorch is in the bundle")
step("import vLLM's extension", vllm_ext)
def versions():
    out = [f"vllm {m.version('vllm')}"]
    import torch
    out += [f"torch {torch.__version__}", f"cuda {torch.version.cuda}", f"gpus {torch.cuda.device_count()}"]
    for name in ("triton", "torchvision", "nixl-cu12", "nixl-cu13", "transformers"):
        try: out.append(f"{name} {m.version(name)}")
        except m.PackageNotFoundError: out.append(f"{name} -")
    try: out.append("nccl " + ".".join(map(str, torch.cuda.nccl.version())))
    except Exception as e: out.append(f"nccl ? ({e})")
    try: out.append(f"cudnn {torch.backends.cudnn.version()}")
    except Exception as e: out.append(f"cudnn ? ({type(e).__name__}: {e})")
    return ", ".join(out)
step("versions", versions)
def nixl_line():
    import nixl._api  # noqa: F401
    return "ok"
step("import nixl._api", nixl_line)
sys.exit(bad)
EOF
}

# link_image_libs: a carried CUDA-12 torch finds its libraries by RPATH in $SITE/nvidia/<lib>/lib
# (torch's search of sys.path runs only when that fails).  The image's CUDA-13 wheels that keep
# the soname of their CUDA-12 builds (cudnn .9, nccl .2, cusparselt .0, nvshmem_host .3) have
# their own folders there: link each one the bundles do not carry into $SITE/nvidia (seen on
# 2026-11-24: without them `import torch` fails on libcusparseLt.so.0).  The image's
# nvidia/cu13 folder (other sonames) is never linked.  XLKV_IMAGE_SITE: the image's
# site-packages (default: this interpreter's, without PYTHONPATH).
link_image_libs() {
  local image d n
  image=${XLKV_IMAGE_SITE:-$(env -u PYTHONPATH "$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}
  [ -d "$image/nvidia" ] && [ -d "$SITE/nvidia" ] || return 0
  for d in "$image"/nvidia/*/; do
    n=$(basename "$d")
    [ "$n" != cu13 ] && [ ! -e "$SITE/nvidia/$n" ] || continue
    ln -s "${d%/}" "$SITE/nvidia/$n" && echo "linked the image's nvidia/$n into $SITE/nvidia"
  done
}

# unpack_chunks DEST: the staged chunks in the current folder are one compressed tar (zstd, or
# xz), split: join them in name order and unpack into DEST.  The zstandard wheel of the first
# bundle set up is kept in $STAGE_ROOT/.zstandard for later ones (a libs bundle has none).
unpack_chunks() {
  local dest=$1 zs="$STAGE_ROOT/.zstandard" first
  first=$(ls p* | sort | head -1)
  if [ "$(head -c 4 "$first" | od -An -tx1 | tr -d ' \n')" = 28b52ffd ] &&
     ! PYTHONPATH="$zs" "$PY" -c 'import zstandard' 2>/dev/null; then
    rm -rf "$zs"
    "$PY" -m pip install -q --no-index --no-deps --target "$zs" zstandard-*.whl
  fi
  # shellcheck disable=SC2046
  cat $(ls p* | sort) | PYTHONPATH="$zs" "$PY" -c '
import sys, tarfile
src = sys.stdin.buffer
head = src.peek(4)[:4] if hasattr(src, "peek") else b""
if head == b"\x28\xb5\x2f\xfd":
    import zstandard
    src = zstandard.ZstdDecompressor().stream_reader(src)
    mode = "r|"
else:
    mode = "r|*"   # xz / gzip: the standard library
with tarfile.open(fileobj=src, mode=mode) as t:
    if hasattr(tarfile, "data_filter"):
        t.extractall(sys.argv[1], filter="fully_trusted")
    else:
        t.extractall(sys.argv[1])
' "$dest"
  echo "unpacked $(ls p* | wc -l) chunks into $dest: $(du -sm "$dest" | cut -f1) MB"
}

case "$cmd" in
build)
  build "${2:-}" "${3:-}"
  ;;
pack)
  pack "${2:?usage: bundle.sh pack SITE DIR VERSION}" "${3:?DIR}" "${4:?VERSION}" "${5:-}"
  ;;
manifest)
  ver=${3:?version}
  write_manifest "$dir" "$ver"
  ;;
rechunk)
  [ -f "$dir/MANIFEST" ] || { echo "usage: bundle.sh rechunk DIR (DIR/MANIFEST and DIR/p<NN> here)" >&2; exit 2; }
  ver=$(awk '$1 == "version" {print $2}' "$dir/MANIFEST")
  bytes=${CHUNK_BYTES:-$(( ${CHUNK_MB:-55} * 1000 * 1000 ))}
  tmp=$(mktemp -d "$dir.rechunk.XXXXXX")
  # shellcheck disable=SC2046
  before=$(cat $(ls "$dir"/p[0-9]* | sort) | sha256sum | cut -d' ' -f1)
  # shellcheck disable=SC2046
  cat $(ls "$dir"/p[0-9]* | sort) | split -b "$bytes" -d -a 2 - "$tmp/p"
  # shellcheck disable=SC2046
  after=$(cat $(ls "$tmp"/p[0-9]* | sort) | sha256sum | cut -d' ' -f1)
  [ "$after" = "$before" ] || { echo "rechunk: the new chunks differ from the old ones" >&2; rm -rf "$tmp"; exit 2; }
  rm -f "$dir"/p[0-9]*
  mv "$tmp"/p[0-9]* "$dir/"
  rm -rf "$tmp"
  write_manifest "$dir" "$ver"
  echo "rechunked $dir: $(ls "$dir"/p[0-9]* | wc -l) chunks of at most $bytes bytes"
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
      if [ -n "$want" ] && [ "$want" != "$got" ]; then echo "CHECKSUM MISMATCH: $f" >&2; rm -f "$dest/$(basename "$f")"; exit 2; fi
    fi
    echo "staged $f"
  done
  [ $n -gt 0 ] || { echo "nothing to stage in $dir (carry $dir/p<NN>)" >&2; exit 2; }
  echo "in $dest now: $(cd "$dest" && ls | xargs)"
  if [ -f "$dest/MANIFEST" ]; then
    left=$(cd "$dest" && awk '$1 == "chunk" || $1 == "wheel" {print $2}' MANIFEST | while read -r f; do [ -f "$f" ] || printf '%s ' "$f"; done)
    echo "still to stage: ${left:-nothing (run setup)}"
  fi
  ;;
setup|add)
  [ -n "$dir" ] || { echo "usage: bundle.sh $cmd DIR" >&2; exit 2; }
  src="$STAGE_ROOT/$(basename "$dir")"
  [ -d "$src" ] || { echo "nothing staged in $src" >&2; exit 2; }
  cd "$src"
  want_ver=""; want_torch=""
  if [ -f MANIFEST ]; then
    want_ver=$(awk '$1 == "version" {print $2}' MANIFEST)
    want_torch=$(awk '$1 == "torch" {print $2}' MANIFEST)
    missing=0
    while read -r kind name sum; do
      [ "$kind" = chunk ] || [ "$kind" = wheel ] || continue
      if [ ! -f "$name" ]; then echo "MISSING: $name (stage it: carry $dir/$name)" >&2; missing=1
      elif [ "$(sha256sum "$name" | cut -d' ' -f1)" != "$sum" ]; then echo "CORRUPT: $name (stage it again)" >&2; missing=1; fi
    done < MANIFEST
    [ $missing = 0 ] || exit 2
  fi
  if [ "$cmd" = add ]; then
    [ -n "$(site_version)" ] || { echo "add: no vLLM in $SITE yet (setup the main bundle first)" >&2; exit 2; }
    if [ -f "$SITE/.added-$(basename "$dir")" ]; then echo "$dir already added to $SITE"
    else unpack_chunks "$SITE" && touch "$SITE/.added-$(basename "$dir")"; fi
    link_image_libs
    # the torch of the main bundle (staged folders are named .xferNN: a bare * misses them)
    want_torch=$(find "$STAGE_ROOT" -mindepth 2 -maxdepth 2 -name MANIFEST -exec awk '$1 == "torch" {print $2}' {} + | head -1)
  else
    have=$(site_version)
    if [ -n "$have" ] && { [ -z "$want_ver" ] || [ "$have" = "$want_ver" ]; }; then
      echo "$SITE already holds vLLM $have"
    else
      [ -z "$have" ] || echo "replacing vLLM $have in $SITE by $want_ver"
      rm -rf "$SITE" && mkdir -p "$SITE"
      unpack_chunks "$SITE"
    fi
    [ -z "$want_torch" ] || echo "the bundle carries torch $want_torch: $(grep '^carry ' MANIFEST | cut -d' ' -f2 | xargs)"
  fi
  probe "$want_torch"
  ;;
check)
  probe
  ;;
build-libs)
  build_libs "${@:2}"
  ;;
*) echo "unknown command $cmd (build build-libs pack manifest stage setup add check)" >&2; exit 2 ;;
esac
