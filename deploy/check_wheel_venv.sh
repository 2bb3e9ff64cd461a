#!/usr/bin/env bash
# What deploy/Dockerfile does, without Docker: build the wheel, install it into a fresh virtual
# environment layered on an existing vLLM environment (the image's role), and run the build's
# check there.  The vLLM environment itself is not changed.
#   bash deploy/check_wheel_venv.sh /path/to/vllm-env/bin/python [OUT_DIR]
# OUT_DIR (default a new temporary folder) keeps the wheel, the venv and status.json.
set -euo pipefail
VLLM_PY=${1:?python of an environment with vLLM and NIXL}
OUT=${2:-$(mktemp -d /tmp/xlkv-wheel-venv.XXXXXX)}
cd "$(dirname "$0")/.."
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
"$VLLM_PY" -m pip wheel -q --no-deps -w "$OUT" .
BASE_SITE=$("$VLLM_PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
BASE_PY=$("$VLLM_PY" -c "import sys; print(sys._base_executable)")
"$BASE_PY" -m venv "$OUT/venv"
SITE=$("$OUT/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# the vLLM environment's packages behind the fresh one's (a derived image's layer over the base)
echo "import site; site.addsitedir('$BASE_SITE')" > "$SITE/_vllm_base.pth"
"$OUT/venv/bin/python" -m pip install -q --disable-pip-version-check "$OUT"/xlkv_autopatch-*.whl
echo "wheel: $(ls "$OUT"/xlkv_autopatch-*.whl)"
echo "installed: $("$OUT/venv/bin/python" -m pip show xlkv_autopatch 2>/dev/null | grep -E '^(Version|Location)' | tr '\n' ' ')"
# flag off: the stock path (status reports, exit 0); flag on: the Dockerfile's build-time check.
# Run outside the checkout, so that `-m` finds the installed package, not ./xlkv_autopatch.
cd "$OUT"
"$OUT/venv/bin/python" -m xlkv_autopatch status > "$OUT/status-off.txt"
grep -q "^xlkv_autopatch .* at $OUT/venv/" "$OUT/status-off.txt" || { echo "not the installed wheel:"; head -1 "$OUT/status-off.txt"; exit 1; }
ENABLE_XLKV=true "$OUT/venv/bin/python" -m xlkv_autopatch status --json > "$OUT/status.json"
ENABLE_XLKV=true "$OUT/venv/bin/python" -m xlkv_autopatch status
echo "status: exit 0 with ENABLE_XLKV=true ($OUT/status.json)"
echo "$OUT"
