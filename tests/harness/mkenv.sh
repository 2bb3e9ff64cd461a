#!/usr/bin/env bash
# Create or reuse a Python environment for one vLLM release.
#   usage: tests/harness/mkenv.sh VLLM_VERSION        -> prints the env's python path (last stdout line)
# Layout under ${XLKV_ENVS:-/work/envs}:
#   torch-<pin>/   base venv, one per torch pin: a full `pip install vllm==X nixl==... numpy pytest`
#                  of the first release asked for with that pin. Never changed afterwards.
#   vllm-<ver>/    overlay venv for every other release of that pin: its site-packages comes
#                  first and adds the base's site-packages behind it (a .pth calling
#                  site.addsitedir), and holds vllm==<ver> (--no-deps) plus only the requirements
#                  the base does not satisfy. Several releases of one pin can therefore be used at
#                  the same time (tests, the compat matrix, a harness run by hand) without one
#                  process swapping another's vLLM.
# A release whose vLLM is the base's gets the base's python.
# The shim itself is NOT installed here (caller: pip install --no-deps -e <repo>).
set -euo pipefail
VER=${1:?usage: mkenv.sh VLLM_VERSION}
ENVS=${XLKV_ENVS:-/work/envs}
NIXL_SPEC=${XLKV_NIXL_SPEC:-nixl==1.5.1}
PY=${XLKV_BASE_PYTHON:-python3}
mkdir -p "$ENVS"
log() { echo "[mkenv $VER] $*" >&2; }

# --- torch pin of this release, from the wheel METADATA (metadata-only dry run, no wheel download)
PINS="$ENVS/pins.tsv"
PIN=""
[ -f "$PINS" ] && PIN=$(awk -v v="$VER" '$1==v{print $2}' "$PINS" | tail -1)
if [ -z "$PIN" ]; then
  REP=$(mktemp)
  "$PY" -m pip install --dry-run --no-deps --ignore-installed -q --report "$REP" "vllm==$VER" >/dev/null 2>&1 || true
  PIN=$("$PY" - "$REP" <<'PYEOF'
import json, re, sys
r = json.load(open(sys.argv[1]))
for d in r["install"][0]["metadata"].get("requires_dist", []):
    m = re.match(r"^torch\s*==\s*([0-9][^;,\s]*)", d)
    if m:
        print(m.group(1)); break
PYEOF
)
  rm -f "$REP"
  [ -n "$PIN" ] || { log "could not determine the torch pin of vllm==$VER"; exit 2; }
  echo -e "$VER\t$PIN" >> "$PINS"
fi
ENV="$ENVS/torch-$PIN"
log "torch pin $PIN -> $ENV"

exec 9>"$ENVS/.torch-$PIN.lock"
flock -w 3600 9

pipx() { "$ENV/bin/python" -m pip "$@"; }
sanity() {
  "$ENV/bin/python" - "$VER" <<'PYEOF'
import sys, importlib.metadata as md
want = sys.argv[1]
got = md.version("vllm")
assert got == want, f"vllm {got} installed, {want} wanted"
import torch, numpy, vllm  # noqa
import nixl._api  # noqa
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa
from vllm.config import VllmConfig, KVTransferConfig  # noqa
print(f"ok vllm={got} torch={torch.__version__} nixl={md.version('nixl')}", file=sys.stderr)
PYEOF
}
vllm_reqs_broken() {  # pip check lines that concern vllm's own requirements
  pipx check 2>/dev/null | grep -i '^vllm ' || true
}

# torch X+cpu (local wheel) with PyPI's CUDA torchvision/torchaudio/torchcodec: importing them
# dies ("operator torchvision::nms does not exist", "Could not load ... .so") and takes
# transformers (hence vllm.config) with it. The harness needs none of them.
drop_unloadable() {
  for m in torchvision torchaudio torchcodec; do
    if "$ENV/bin/python" -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('$m') else 1)" 2>/dev/null \
       && ! "$ENV/bin/python" -c "import $m" >/dev/null 2>&1; then
      log "$m does not load with this torch build; uninstalling it"
      pipx uninstall -y -q "$m" >&2
    fi
  done
}

if [ ! -f "$ENV/.xlkv-base-ok" ]; then
  log "creating venv"
  rm -rf "$ENV"   # nothing, or an install that was interrupted
  "$PY" -m venv "$ENV"
  pipx install -q --upgrade pip >&2
  t0=$(date +%s)
  if ! pipx install "vllm==$VER" "$NIXL_SPEC" numpy pytest 2>"$ENV/.install.err" >&2; then
    cat "$ENV/.install.err" | grep -v "WARNING: Location" | tail -3 >&2
    # A requirement the registry here cannot satisfy (e.g. vllm 0.33 wants
    # certifi>=2026.10.19): install vllm's requirements with ONLY that lower bound dropped,
    # then vllm itself with --no-deps. Logged loudly.
    BAD=$(grep -o "No matching distribution found for [A-Za-z0-9_.-]*" "$ENV/.install.err" | awk '{print $NF}' | head -1)
    [ -n "$BAD" ] || exit 3
    log "relaxing the version bound of unsatisfiable requirement '$BAD'"
    REQS=$("$ENV/bin/python" - "$VER" "$BAD" <<'PYEOF'
import json, subprocess, sys, tempfile
from pip._vendor.packaging.requirements import Requirement
ver, bad = sys.argv[1], sys.argv[2].lower().replace("_", "-")
rep = tempfile.mktemp()
subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "-q",
                "--ignore-installed", "--report", rep, f"vllm=={ver}"], check=True,
               capture_output=True)
out = []
for d in json.load(open(rep))["install"][0]["metadata"].get("requires_dist", []):
    r = Requirement(d)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    name = r.name + (f"[{','.join(sorted(r.extras))}]" if r.extras else "")
    out.append(name if r.name.lower().replace("_", "-") == bad else f"{name}{r.specifier}")
print("\n".join(out))
PYEOF
)
    echo "$REQS" > "$ENV/.relaxed-reqs.txt"
    pipx install -r "$ENV/.relaxed-reqs.txt" "$NIXL_SPEC" numpy pytest >&2
    pipx install --no-deps "vllm==$VER" >&2
  fi
  log "full install took $(( $(date +%s) - t0 )) s"
  drop_unloadable
  touch "$ENV/.xlkv-base-ok"
fi
exec 9>&-   # the base is complete and is never changed again: release the pin lock
BASE="$ENV"
BASE_VER=$("$BASE/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || echo none)
if [ "$BASE_VER" != "$VER" ]; then
  # overlay venv for this release (see the header); its own lock, the base stays untouched
  ENV="$ENVS/vllm-$VER"
  exec 8>"$ENVS/.vllm-$VER.lock"
  flock -w 3600 8
  if [ ! -f "$ENV/.xlkv-overlay-ok" ]; then
    log "overlay $ENV over $BASE (base has vllm $BASE_VER)"
    rm -rf "$ENV"
    "$PY" -m venv "$ENV"
    OSITE=$("$ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    BSITE=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$BSITE')" > "$OSITE/_xlkv_overlay_base.pth"
    pipx install -q --no-deps "vllm==$VER" >&2
    BROKEN=$(vllm_reqs_broken)
    if [ -n "$BROKEN" ]; then
      log "vllm $VER requirements the base does not meet, installed into the overlay (torch stays pinned):"
      echo "$BROKEN" >&2
      pipx install -q "vllm==$VER" >&2
    fi
    drop_unloadable
    touch "$ENV/.xlkv-overlay-ok"
  fi
fi
if ! sanity; then
  log "sanity import failed; re-resolving vllm==$VER requirements"
  pipx install -q "vllm==$VER" "$NIXL_SPEC" numpy pytest >&2
  drop_unloadable
  sanity
fi
echo "$ENV/bin/python"
