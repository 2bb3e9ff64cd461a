"""What the descriptor-coalescing lever rests on, with real NIXL (UCX on host memory): NIXL merges
descriptors whose memory is contiguous and increasing on both sides, in list order, and
nothing else (experiments/probes/nixl_merge_probe.py)."""

import json
import os

from conftest import ROOT, once_per_session, run_in

PROBE = os.path.join(ROOT, "experiments", "probes", "nixl_merge_probe.py")


def test_nixl_merges_only_runs_contiguous_and_increasing_on_both_sides(vllm_env, tmp_path):
    once_per_session(vllm_env, "NIXL's behaviour, not vLLM's")
    out = tmp_path / "merge.json"
    r = run_in(vllm_env[1], [PROBE, "--blocks", "32", "--block-bytes", "65536", "--out", str(out)], timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    orders = json.loads(out.read_text())["orders"]
    assert all(o["bytes_ok"] for o in orders.values()), orders
    assert orders["ascending"]["descCount"] == 1 and orders["sorted"]["descCount"] == 1, orders
    assert orders["descending"]["descCount"] == 32 and orders["mixed"]["descCount"] == 32, orders
