"""vLLM's own NIXL unit tests (from the release's sdist), stock vs ENABLE_XLKV=true (and with every
switch on too), on CPU.

experiments/upstream/cpu-passing.json pins, per release, the test ids of
``tests/v1/kv_connector/unit/test_nixl_*.py`` that pass *stock* on a machine without a GPU
(``upstream_tests.py pin-cpu``).  Here each of them runs three times in the release's environment:
with the shim hidden from the interpreter (stock), with the flag on, and with the flag and every switch on.  Every id must pass
stock (otherwise the pin is stale) and give the same outcome with the flag on, and with the flag and every
switch on (``switches``: XLKV_DETOK_TAIL), unless
upstream_tests.INTENDED names the difference and its reason.  The probe plugin refuses an
"on" run in which no NIXL patch set was applied, so a green "on" run is not a stock run.

This is where vLLM 0.33's HiSparse host-pool tests
(``test_nixl_keeps_device_block_count_with_hisparse_host_pool[8|16]``) failed with the flag
on before patches/block_count.py left stock-layout registrations to vLLM.
"""

import concurrent.futures
import importlib.util
import json
import os
import subprocess

import pytest

from conftest import ROOT

TOOL = os.path.join(ROOT, "experiments", "upstream", "upstream_tests.py")
_spec = importlib.util.spec_from_file_location("upstream_tests", TOOL)
upstream = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(upstream)

PINS = json.load(open(upstream.CPU_PINS))


def test_pins_name_releases_the_tool_can_fetch():
    assert PINS, "experiments/upstream/cpu-passing.json pins no release"
    for release, pin in PINS.items():
        assert upstream.RELEASES.get(release), "%s is pinned for CPU but has no sdist sha256" % release
        assert pin["passing_stock"], release


def test_vllm_own_nixl_tests_same_outcomes_with_the_flag_on(vllm_env, tmp_path):
    version, python = vllm_env
    if version not in PINS:
        pytest.skip("no CPU pin of vLLM %s's own NIXL tests (%s have one)" % (version, ", ".join(sorted(PINS))))
    r = subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "tblib"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    ids = PINS[version]["passing_stock"]
    out = str(tmp_path / "upstream.json")
    parts = {mode: str(tmp_path / ("%s.json" % mode)) for mode in ("stock", "on", "switches")}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # the modes side by side (three processes)
        for f in [pool.submit(upstream.run, version, python, mode, part, "ci-cpu", ids=ids, timeout=1500)
                  for mode, part in parts.items()]:
            f.result()
    upstream.merge(out, list(parts.values()))
    result = json.load(open(out))
    stock = result["modes"]["stock"]["outcomes"]
    stale = sorted(t for t in ids if stock.get(t) != "passed")
    assert not stale, ("these pinned ids no longer pass stock on CPU (re-pin with upstream_tests.py pin-cpu %s): %s"
                       % (version, stale[:10]))
    differ = [d for d in upstream.differences(result) if not d["reason"]]
    assert not differ, "vLLM %s's own NIXL tests differ with ENABLE_XLKV=true (or its switches): %s" % (version, differ)
    for mode in ("on", "switches"):
        assert result["modes"][mode]["passed"] == len(ids), (mode, result["modes"][mode])
        assert any(c["mode"] == mode and c["shim"]["applied_groups"] for c in result["calls"]), mode
