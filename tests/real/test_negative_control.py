"""The negative control of the equivalence checks, driven through the CPU harness: real vLLM
NixlConnector + real NIXL, P and D as two processes (tests/harness/pd_harness.py).

experiments/negative_control/ (experiments only, never in the installed package) is put first
on D's PYTHONPATH; its sitecustomize.py wraps the NIXL connector worker's completion poll and
corrupts the first block of every request whose KV just arrived.  The harness's byte-for-byte
comparison must catch that, for the stock layout and for the shim's cross-layer layout, while
the same runs without the hook pass.  A check that cannot see this fault would not see a real
block-indexing bug either."""

import os
import re

import pytest

from conftest import ROOT, harness, once_per_session

HOOK_DIR = os.path.join(ROOT, "experiments", "negative_control")
LAYERS = 4  # the harness model


def hooked(how):
    return ["--d-env", "PYTHONPATH=" + HOOK_DIR, "--d-env", "XLKV_NEGATIVE_CONTROL=" + how]


LAYOUTS = {"stock": {}, "shim": {"ENABLE_XLKV": "true"}}


# The same runs without the hook pass: tests/real/test_pd_transfer.py (stock and xlkv fixtures,
# transfer_verified, every case byte-exact) on every release.


@pytest.mark.parametrize("how", ["shift", "swap-layers"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_corrupted_block_is_caught_by_the_byte_comparison(vllm_env, tmp_path, layout, how):
    if how == "swap-layers" and vllm_env[0] != "0.14.1":  # 0.14.1: the backport's own flat view
        once_per_session(vllm_env, "swap-layers needs the layout the hook computes, checked on one release per view")
    if layout == "stock" and how == "shift":  # the comparison is the harness's; vLLM's per-layer regions
        once_per_session(vllm_env, "the stock layout's per-layer regions; the shim's layout runs on every release")
    r = harness(vllm_env[1], tmp_path, "nc-%s-%s" % (layout, how), "--case", "noncontig", *hooked(how),
                env=LAYOUTS[layout])
    log = r["_log"]
    # the hook loaded in D only, found the release's worker class and acted once
    assert "xlkv negative control: armed (%s)" % how in log, log[-3000:]
    assert re.search(r"xlkv negative control: wrapped Nixl\w*ConnectorWorker\.get_\w+ in vllm\.", log), log[-3000:]
    acted = re.findall(r"xlkv negative control: request (\S+): %s: (.*) \(pid \d+\)" % how, log)
    assert [req for req, _ in acted] == ["req-noncontig-a"], log[-3000:]
    assert "FAILED" not in acted[0][1], acted
    # the layout under test is the one the clean run has (the hook does not switch the shim off)
    if layout == "shim":
        assert r["cross_layer"] is True or (r["descs_per_block"] == 1), r
    else:
        assert r["descs_per_block"] >= LAYERS, r
    # the byte comparison catches it: exactly the corrupted block (local 30, from remote 7)
    case = r["cases"]["noncontig"]
    assert r["transfer_verified"] is False and case["bytes_ok"] is False, case
    assert case["recv_done"] is True and case["invalid_block_ids"] == [], case
    bad = case["mismatches"]
    assert bad and all(m.endswith("local block 30 != remote block 7") for m in bad), bad
    expected_layers = LAYERS if how == "shift" else 2
    assert len(bad) == expected_layers, bad
    if how == "shift":
        assert "block 30 <- block 31" in acted[0][1]
