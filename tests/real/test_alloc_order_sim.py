"""experiments/probes/alloc_order_sim.py on the real vLLM BlockPool of the newest CI release, with real NIXL
as the judge: the block lists vLLM's pool hands out under a churned free queue are moved by
NIXL (UCX on host memory), in vLLM's order and in transfer_order's, and the descriptor counts
the simulator reports (the shim's arithmetic, layout.merged_descriptor_count) must be the
counts NIXL's telemetry reports for those very lists, with the bytes exact.  The saving that
the descriptor-count analysis rests on is then taken from NIXL's counts, not from the arithmetic."""

import json
import os

from conftest import ROOT, once_per_session, run_in

SIM = os.path.join(ROOT, "experiments", "probes", "alloc_order_sim.py")
CHECKED = 8  # requests per policy moved by NIXL


def test_alloc_order_sim_counts_are_nixls_on_the_real_block_pool(vllm_env, tmp_path):
    once_per_session(vllm_env, "an experiments tool around vLLM's BlockPool")
    out = tmp_path / "sim.json"
    r = run_in(vllm_env[1], [SIM, "--blocks", "6000", "--len", "2048", "--n", "32", "--frag", "120",
                             "--frag-len", "512", "--reps", "2", "--nixl-check", str(CHECKED), "--out", str(out)],
               timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    pol = json.loads(out.read_text())["policies"]
    for name, phases in pol.items():
        checked = [q for q in phases[-1]["requests"] if "nixl" in q]
        assert len(checked) == CHECKED, (name, len(checked))
        for q in checked:
            assert q["nixl"]["bytes_ok"] is True, (name, q)
            # the simulator's numbers are NIXL's, in both orders
            assert (q["nixl"]["vllm_order"], q["nixl"]["transfer_order"]) == (q["vllm_order"], q["transfer_order"]), \
                (name, q)
    # after the pool turned over, vLLM's own order costs NIXL more than twice the descriptors of
    # transfer_order's for the same blocks (measured: 128 vs 8-22 per 128-block transfer)
    vl = [q["nixl"] for q in pol["vllm_allocation"][-1]["requests"] if "nixl" in q]
    assert sum(x["vllm_order"] for x in vl) > 2 * sum(x["transfer_order"] for x in vl), vl
