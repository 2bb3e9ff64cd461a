"""patches/transfer_order.py through real vLLM + NIXL (UCX on host memory): turned off it
leaves vLLM's descriptor order, and the harness's byte check catches a reorder that breaks
(local, remote) pairs.  The merge itself with the order on is asserted on every release by
test_pd_transfer.py (the xlkv run) and by the compat matrix."""

from conftest import harness, once_per_session, release_of

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


def test_a_stock_layout_worker_under_the_flag_merges_its_runs_too(vllm_env, tmp_path):
    """Workers that keep vLLM's per-layer regions under ENABLE_XLKV (sparse MLA, Mamba, pipeline
    parallel > 1 on 0.29+, every fallback; here an explicit stock layout) get the ascending order too:
    8 descending blocks merge to one descriptor per region instead of one per block and region."""
    once_per_session(vllm_env, "one release shows the stock-layout ordering")
    env = {"ENABLE_XLKV": "true"}
    if release_of(vllm_env) >= (0, 29):  # keep the stock layout with the flag on
        env["VLLM_KV_CACHE_LAYOUT"] = "LBHNC"
    else:
        env["VLLM_KV_CACHE_LAYOUT"] = "NHD"  # cross-layer blocks need HND: the stock layout is kept
    cases = ("--case", "reversed", "--case", "interleaved")
    ordered = harness(vllm_env[1], tmp_path, "stock_layout_ordered", *cases, env=env)
    kept = harness(vllm_env[1], tmp_path, "stock_layout_kept", *cases, env=dict(env, XLKV_COALESCE="false"))
    for r in (ordered, kept):
        assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
        assert r["cross_layer"] is False and r["num_regions"] > 1
    regions = ordered["num_regions"]
    assert kept["cases"]["reversed"]["nixl_descs"] == BLOCKS * regions  # vLLM's order: nothing merges
    assert ordered["cases"]["reversed"]["nixl_descs"] == regions  # one run per region
    # interleaved: P 6..11 into D 14,20,15,21,16,22: two ascending runs per region once ordered
    assert ordered["cases"]["interleaved"]["nixl_descs"] == 2 * regions < kept["cases"]["interleaved"]["nixl_descs"]
