"""patches/transfer_order.py through real vLLM + NIXL (UCX on host memory): turned off it
leaves vLLM's descriptor order, and the harness's byte check catches a reorder that breaks
(local, remote) pairs.  The merge itself with the order on is asserted on every release by
test_pd_transfer.py (the xlkv run) and by the compat matrix."""

from conftest import harness, once_per_session

BLOCKS = 8  # the "reversed" case: P blocks 19..12 into D blocks 39..32, both descending


def test_coalescing_off_keeps_vllms_descriptor_order(vllm_env, tmp_path):
    once_per_session(vllm_env, "one release shows the switch")
    r = harness(vllm_env[1], tmp_path, "keep_order", "--case", "reversed",
                env={"ENABLE_XLKV": "true", "XLKV_COALESCE": "false"})
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    c = r["cases"]["reversed"]
    assert r["cross_layer"] is True and c["bytes_ok"]
    assert c["nixl_descs"] == BLOCKS * r["descs_per_block"]  # one per block: nothing merged


def test_a_reorder_that_breaks_pairs_is_caught(vllm_env, tmp_path):
    once_per_session(vllm_env, "harness self-test")
    r = harness(vllm_env[1], tmp_path, "misorder", "--case", "reversed", "--plant-fault", "misorder",
                env={"ENABLE_XLKV": "true"})
    c = r["cases"]["reversed"]
    assert r["transfer_verified"] is False and c["bytes_ok"] is False
    assert c["num_mismatches"] >= BLOCKS - 1, c  # every block but a middle one lands elsewhere
