"""Heterogeneous tensor parallelism, real vLLM + real NIXL on CPU: the harness runs a side at
TP 2 (two worker ranks in a gloo group, one NIXL agent each; the model's 2 KV heads give each
decode rank one head), and the parent checks that every decode rank received exactly its
heads' slice of every layer and block.

The rule under test (docs/safety.md, xlkv_autopatch/patches/handshake.py), ENABLE_XLKV
on both sides, FLASH_ATTN: prefill TP 1 -> decode TP 2 is allowed where a cross-layer block
keeps heads outermost (0.12-0.22, 0.26-0.28, and 0.29+ with xlkv's BHLNC rows) and
must then arrive byte for byte with one descriptor per block per remote rank; it is refused at
handshake, naming heterogeneous TP, on 0.23-0.25. Stock vLLM (flag off) at TP 1 -> 2 is the
control; TP 2 -> 2 with the shim is homogeneous and must transfer exactly."""

import json
import os

import pytest

from conftest import harness, once_per_session, release_of

XLKV = {"ENABLE_XLKV": "true"}


def hetero_tp_allowed(release):
    """Where FLASH_ATTN's cross-layer blocks keep the KV heads outermost, so xlkv serves prefill TP 1 ->
    decode TP 2 with them; elsewhere (0.23-0.25) the engine keeps the stock layout and serves it as stock
    (XLKV_EQUAL_TP=true would keep the blocks and refuse the pair)."""
    return (0, 12) <= release < (0, 23) or (0, 26) <= release


@pytest.fixture(scope="module")
def xlkv_1to2(vllm_env, tmp_path_factory):
    return harness(vllm_env[1], tmp_path_factory.mktemp("tp"), "xlkv_1to2", "--d-tp", "2", env=XLKV, step_timeout=60)


def _heads(shape):
    # per-layer views: [..., tokens, heads, 64] up to 0.25, [blocks, heads, tokens, 128] from 0.26
    return shape[-2] if shape[-1] == 64 else shape[-3]


def _vllm_ranks(ranks):
    """(TP rank, TP size) of each rank's NIXL connector worker, as vLLM's parallel state gave
    them (the harness only starts the processes)."""
    return [(x["worker"].get("tp_rank"), x["worker"].get("world_size")) for x in ranks]


def _assert_exact(r, p_tp, d_tp, kv_heads=2):
    # each process is the rank the parent checks it as, in vLLM's own parallel state
    assert _vllm_ranks(r.get("d_ranks") or []) == [(i, d_tp) for i in range(d_tp)], (r.get("d_ranks"), r["errors"])
    assert _vllm_ranks(r.get("p_ranks") or []) == [(i, p_tp) for i in range(p_tp)], (r.get("p_ranks"), r["errors"])
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    # each rank holds its share of the model's KV heads
    for x in r["d_ranks"]:
        assert _heads(x["layer_view_shape"]) == kv_heads // d_tp, x
    for x in r["p_ranks"]:
        assert _heads(x["layer_view_shape"]) == kv_heads // p_tp, x
    assert set(r["cases"]) == {"noncontig", "partial", "reuse", "ascending", "reversed", "interleaved", "shared"}
    for name, case in r["cases"].items():
        assert case["ok"] and case["bytes_ok"] and case["p_done_sending"], (name, case)
        ranks = case["ranks"] if d_tp > 1 else [case]  # the harness lists ranks at D TP > 1 only
        assert len(ranks) == d_tp, (name, case)
        for rank in ranks:
            assert rank["recv_done"] and rank["bytes_ok"] and rank["invalid_block_ids"] == [], (name, case)


def test_stock_tp1_to_tp2_transfers_each_rank_its_heads(vllm_env, tmp_path_factory):
    # the control: stock vLLM splits each prefill block by heads between the two decode ranks
    # (stock vLLM and the harness's TP ranks, no shim: one release; the compatibility matrix runs
    # it on every release)
    once_per_session(vllm_env, "the stock control of the harness's TP ranks, no shim in it")
    stock_1to2 = harness(vllm_env[1], tmp_path_factory.mktemp("tp"), "stock_1to2", "--d-tp", "2", step_timeout=60)
    _assert_exact(stock_1to2, 1, 2)
    assert stock_1to2["cross_layer"] is False
    assert all(x["cross_layer"] is False for x in stock_1to2["d_ranks"])
    assert "xlkv_autopatch" not in stock_1to2["_log"]


def test_xlkv_tp1_to_tp2_follows_the_release_rule(vllm_env, xlkv_1to2):
    r = xlkv_1to2
    if hetero_tp_allowed(release_of(vllm_env)):
        _assert_exact(r, 1, 2)
        assert all(x["cross_layer"] is True for x in r["d_ranks"] + r["p_ranks"]), r["d_ranks"]
        assert r["descs_per_block"] == 1
        for name, case in r["cases"].items():
            # every decode rank reads its heads' slice of a block with one descriptor
            assert [x["xfer_descs_per_block"] for x in case["ranks"]] == [1, 1], (name, case)
        if release_of(vllm_env) >= (0, 29):
            # the heads-outermost rows on both sides: one head per decode rank, two on prefill,
            # each side one region per block (page_contiguous.py has vLLM register the one-head rows whole)
            assert r["kv_layout"] == "BHLNC" and r["num_regions"] == 1, (r["kv_layout"], r["num_regions"])
            for x in r["d_ranks"] + r["p_ranks"]:
                assert (x["worker"].get("kv_cache_layout"), x["worker"].get("num_regions")) == ("BHLNC", 1), x
                assert "the KV heads outermost in each row" in json.dumps(x["xlkv_log"]), x["xlkv_log"]
        return
    _assert_kept_stock_and_served(r, 1, 2, "FLASH_ATTN")


def _assert_kept_stock_and_served(r, p_tp, d_tp, backend, kv_heads=2):
    """The flag on, cross-layer blocks that cannot be sliced by KV heads: each side keeps
    the stock layout, says why in one INFO line naming XLKV_EQUAL_TP, and the pair moves exact bytes."""
    _assert_exact(r, p_tp, d_tp, kv_heads=kv_heads)
    assert all(x["cross_layer"] is False for x in r["d_ranks"] + r["p_ranks"]), r["d_ranks"]
    _assert_said_kept_for_any_tp(r, backend)


def _assert_said_kept_for_any_tp(r, cause):
    """The shim's INFO line (never a WARNING) saying it kept the stock layout so that any TP pairing is served,
    naming ``cause`` (the backend, or the packed rows) and the knob."""
    said = [line for line in r["_log"].splitlines() if "XLKV_EQUAL_TP=true gives 1 descriptor per block" in line]
    assert said and all("INFO " in line and "WARNING" not in line and cause in line for line in said), \
        said or r["_log"][-3000:]


def _assert_refused_naming_equal_tp(r, p_tp, d_tp, words, invalid_reported=True):
    assert r["transfer_verified"] is False
    text = json.dumps(r["errors"]) + json.dumps([c.get("failure_reason") for c in r["cases"].values()]) + r["_log"]
    assert "xlkv_autopatch: NIXL handshake refused: prefill TP %d, decode TP %d" % (p_tp, d_tp) in text, text[-3000:]
    assert words in text and "Fix: unset XLKV_EQUAL_TP on both engines" in text, text[-3000:]
    for case in r["cases"].values():
        assert not case["ok"] and not case.get("xfer_descs"), case
        # the refusal leaves decode serving: every case, the later ones too, is answered on every decode rank,
        # its blocks reported invalid (vLLM's failure path), no rank died
        ranks = case.get("ranks") or [case]
        assert all(x["recv_done"] and (x["invalid_block_ids"] or not invalid_reported) for x in ranks), (
            case.get("ranks"), r["errors"])
    assert "d_died" not in r, r.get("d_died")


def test_blocks_first_backend_keeps_the_stock_layout_and_serves_tp1_to_tp2(vllm_env, tmp_path):
    """TRITON_ATTN's cross-layer blocks (0.20-0.28) are blocks-first, so a remote rank's
    heads are not one range of a block.  With the flag the engine keeps the stock layout (INFO line) and
    serves TP 1 -> 2 exactly, as stock does; with XLKV_EQUAL_TP=true it keeps the cross-layer blocks and the
    handshake refuses the pair, naming the knob.  Fails if the shim takes cross-layer blocks there by
    default (the handshake then refuses a pairing stock serves)."""
    rel = release_of(vllm_env)
    if not (0, 20) <= rel < (0, 29):
        pytest.skip("TRITON_ATTN is in upstream's cross-layer guard on 0.20-0.28 (0.29+: layouts, any backend)")
    args = ("--attn-backend", "TRITON_ATTN", "--d-tp", "2", "--case", "noncontig", "--case", "partial")
    r = harness(vllm_env[1], tmp_path, "triton_1to2", *args, env=XLKV, step_timeout=60)
    assert r["backend"] == "TRITON_ATTN", r["backend"]
    _assert_exact_cases(r, 2)
    assert all(x["cross_layer"] is False for x in r["d_ranks"] + r["p_ranks"]), r["d_ranks"]
    _assert_said_kept_for_any_tp(r, "TRITON_ATTN")
    equal = harness(vllm_env[1], tmp_path, "triton_1to2_equal", *args, env=dict(XLKV, XLKV_EQUAL_TP="true"),
                    step_timeout=60)
    assert all(x["cross_layer"] is True for x in equal["d_ranks"] + equal["p_ranks"]), equal["d_ranks"]
    _assert_refused_naming_equal_tp(equal, 1, 2, "blocks-first backend")
    # the regions per block status --model and the lab's limit predict for this backend on this release
    # (layout.cross_layer_regions with the release's kv_split_regions column: 2 on 0.20-0.25, 1 on 0.26-0.28)
    from xlkv_autopatch import facts, layout
    predicted = layout.cross_layer_regions(backend="TRITON_ATTN",
                                           kv_split_regions=facts.facts_for(vllm_env[0]).kv_split_regions)
    assert equal["registered"]["descs_per_block_id"] == predicted, (equal["registered"], predicted)


def _assert_exact_cases(r, d_tp):
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    for name, case in r["cases"].items():
        assert case["ok"] and case["bytes_ok"], (name, case)
        assert len(case["ranks"]) == d_tp and all(x["bytes_ok"] for x in case["ranks"]), (name, case)


def test_xlkv_tp2_to_tp1_follows_the_release_rule(vllm_env, tmp_path):
    """Prefill TP 2 -> decode TP 1 (each decode block is read from both prefill ranks, two heads each).
    4 KV heads: with one KV head per prefill rank vLLM 0.14 itself refuses P TP > D TP (its
    is_kv_replicated counts TP == KV heads as replicated; stock too)."""
    r = harness(vllm_env[1], tmp_path, "xlkv_2to1", "--p-tp", "2", "--kv-heads", "4", env=XLKV, step_timeout=60)
    if hetero_tp_allowed(release_of(vllm_env)):
        _assert_exact(r, 2, 1, kv_heads=4)
        assert all(x["cross_layer"] is True for x in r["d_ranks"] + r["p_ranks"]), r["p_ranks"]
        for name, case in r["cases"].items():
            # one descriptor per prefill rank (its head of the block), per block
            assert case["xfer_descs_per_block"] == 2, (name, case)
        return
    _assert_kept_stock_and_served(r, 2, 1, "FLASH_ATTN", kv_heads=4)


@pytest.fixture(scope="module")
def xlkv_2to2(vllm_env, tmp_path_factory):
    # the model's 2 KV heads at TP 2: one KV head per rank (TP equal to the KV heads is common:
    # 8 KV heads at TP 8)
    return harness(vllm_env[1], tmp_path_factory.mktemp("tp"), "xlkv_2to2", "--p-tp", "2", "--d-tp", "2", env=XLKV,
                   step_timeout=60)


def test_xlkv_tp2_to_tp2_one_kv_head_per_rank(vllm_env, xlkv_2to2):
    """One region and one descriptor per block on every rank: 0.12-0.28 a cross-layer tensor per
    rank; 0.29+ BLNHC rows, which vLLM registers one region per layer at one head per rank (a
    layer's page is contiguous then) unless patches/page_contiguous.py hands it the pages as
    non-contiguous views of the same bytes (fails without that patch on 0.33)."""
    r = xlkv_2to2
    _assert_exact(r, 2, 2)
    # the ranks of each side were forked from one process of that side (the harness's default; the
    # shim's hooks fired there, and each rank still registered and moved its own heads above)
    spawn_each = os.environ.get("XLKV_HARNESS_FORK_RANKS", "1").strip().lower() in ("0", "false", "no", "off")
    assert r["tp"]["forked_from_one_process"] == ([] if spawn_each else ["p", "d"]), r["tp"]
    assert all(x["cross_layer"] is True for x in r["d_ranks"] + r["p_ranks"]), r["d_ranks"]
    assert r["descs_per_block"] == 1 and r["num_regions"] == 1, (r["descs_per_block"], r["num_regions"])
    for name, case in r["cases"].items():
        assert [x["xfer_descs_per_block"] for x in case["ranks"]] == [1, 1], (name, case)
    if release_of(vllm_env) >= (0, 29):
        assert r["kv_layout"] == "BHLNC", r["kv_layout"]
        for x in r["d_ranks"] + r["p_ranks"]:
            # after the whole-row registration the worker keeps the runner's own views (its
            # receive post-processing reads them), not the content-major views page_contiguous.py handed it
            assert x["worker"]["device_views_are_the_runners"] is True, x["worker"]
            said = json.dumps(x["xlkv_log"])
            assert "one KV head per tensor-parallel rank: each block's row (4 layers" in said, said[-2000:]
            assert "heads-outermost BHLNC rows, each registered as one region" in said, said[-2000:]  # its hash


def test_xlkv_tp2_to_tp2_never_moves_more_descriptors_than_stock(vllm_env, xlkv_2to2, tmp_path):
    """NIXL's own descriptor count (its telemetry, after its merge) per case and decode rank, stock vs
    xlkv at TP 2 -> 2 with one KV head per rank.  Before the fix, 0.33 moved 32 descriptors for 8
    ascending blocks with xlkv and 4 stock."""
    if release_of(vllm_env) < (0, 26):
        pytest.skip("compared on 0.26+ (one region per layer in stock vLLM, the layouts of the issue); "
                    "0.12-0.25 register one cross-layer region per rank, as the test above asserts")
    stock = harness(vllm_env[1], tmp_path, "stock_2to2", "--p-tp", "2", "--d-tp", "2", step_timeout=60)
    _assert_exact(stock, 2, 2)
    for name, case in xlkv_2to2["cases"].items():
        x, s = case.get("nixl_descs"), stock["cases"][name].get("nixl_descs")
        assert x is not None and s is not None, "vLLM read no NIXL telemetry: %s" % name
        assert x <= s, (name, "xlkv", x, "stock", s)
    # the case of the issue: 8 blocks ascending on both sides merge to one descriptor per region
    assert stock["cases"]["ascending"]["nixl_descs"] == stock["num_regions"], stock["cases"]["ascending"]


def test_xlkv_tp2_to_tp2_with_two_kv_heads_per_rank_is_cross_layer(vllm_env, tmp_path):
    # 4 KV heads, 2 per rank: block-outermost on 0.29+ too (a layer's page is not contiguous in the
    # row, so vLLM registers whole rows: one descriptor per block)
    if release_of(vllm_env) < (0, 29):
        pytest.skip("0.12-0.28: heads per rank do not change the layout (one KV head per rank is tested above)")
    r = harness(vllm_env[1], tmp_path, "xlkv_2to2_4h", "--p-tp", "2", "--d-tp", "2", "--kv-heads", "4",
                env=XLKV)
    _assert_exact(r, 2, 2, kv_heads=4)
    assert all(x["cross_layer"] is True for x in r["d_ranks"] + r["p_ranks"]), r["d_ranks"]
    assert r["descs_per_block"] == 1
    for name, case in r["cases"].items():
        assert [x["xfer_descs_per_block"] for x in case["ranks"]] == [1, 1], (name, case)


def test_the_per_rank_comparison_catches_a_rank_holding_other_heads(vllm_env, tmp_path):
    once_per_session(vllm_env, "the harness's per-rank comparison, not the release, is under test")
    # planted fault: decode's ranks start in reverse order while the parent checks them as if
    # in order, so each process's (correctly transferred) head is compared with the other head
    r = harness(vllm_env[1], tmp_path, "swapped", "--d-tp", "2", "--case", "noncontig",
                "--plant-fault", "swap-d-ranks")
    assert _vllm_ranks(r["d_ranks"]) == [(1, 2), (0, 2)]  # the fault is in place: checked as 0, 1
    case = r["cases"]["noncontig"]
    assert all(x["recv_done"] for x in case["ranks"]), case  # the transfer itself completed
    assert r["transfer_verified"] is False and case["bytes_ok"] is False
    assert all(x["num_mismatches"] > 0 for x in case["ranks"]), case
    assert "(D rank 0: heads 0..0)" in json.dumps(case["mismatches"]), case["mismatches"]


def test_xlkv_tp1_to_tp2_catches_a_planted_wrong_head_offset(vllm_env, tmp_path):
    """The byte check of heterogeneous TP with xlkv's rows has teeth: with vLLM's head slot of every
    decode rank forced to 0 (harness --plant-fault head-offset), decode rank 1 reads rank 0's heads
    and the run fails on that rank's bytes while the transfer itself completes."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("the plant wraps vLLM 0.29+'s TP mapping (nixl/tp_mapping.py)")
    r = harness(vllm_env[1], tmp_path, "offset", "--d-tp", "2", "--kv-heads", "4", "--case", "noncontig",
                "--plant-fault", "head-offset", env=XLKV, step_timeout=60)
    assert r["kv_layout"] == "BHLNC", (r["kv_layout"], r["errors"])
    case = r["cases"]["noncontig"]
    assert all(x["recv_done"] for x in case["ranks"]), case
    assert r["transfer_verified"] is False and case["bytes_ok"] is False
    assert [x["bytes_ok"] for x in case["ranks"]] == [True, False], case["ranks"]


def test_xlkv_sliding_window_hybrid_tp1_to_tp2_one_kv_head_per_decode_rank(vllm_env, tmp_path):
    """The llm-d gpt-oss case (P TP 1 -> D TP 2; a sliding-window hybrid at one
    KV head per rank was once registered per layer: 3 regions per block id while the log and status said 1): the
    gpt-oss-shaped hybrid (2 KV heads, several KV cache groups) with the flag, bytes exact on both decode
    ranks, one region per block id on every rank, 1 descriptor per block id per remote rank."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("0.24-0.28: the test below; 0.12-0.23 plan one group or keep the stock layout")
    r = harness(vllm_env[1], tmp_path, "swa_1to2", "--family", "sliding-window", "--d-tp", "2", env=XLKV, step_timeout=60)
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    assert _vllm_ranks(r["d_ranks"]) == [(0, 2), (1, 2)]
    for x in r["d_ranks"] + r["p_ranks"]:
        assert (x["worker"].get("kv_cache_layout"), x["worker"].get("num_regions")) == ("BHLNC", 1), x["worker"]
        assert "the KV heads outermost in each row" in json.dumps(x["xlkv_log"]), x["xlkv_log"]
    for x in r["d_ranks"]:
        assert _heads(x["layer_view_shape"]) == 1, x
        assert "one KV head per tensor-parallel rank: each block's row" in json.dumps(x["xlkv_log"]), x["xlkv_log"]
    assert len(r["kv_cache_groups"]) >= 2, r["kv_cache_groups"]
    for name, case in r["cases"].items():
        assert case["ok"] and case["bytes_ok"], (name, case)
        assert [x["xfer_descs_per_block"] for x in case["ranks"]] == [1, 1], (name, case)


def test_packed_sliding_window_hybrid_keeps_the_stock_layout_and_serves_tp1_to_tp2(vllm_env, tmp_path):
    """0.24-0.28: vLLM's packed multi-group rows (every layer's page of every KV cache
    group one after the other) cannot be sliced by KV heads.  With the flag the hybrid keeps the stock
    layout (INFO line) and TP 1 -> 2 moves exact bytes on both decode ranks, as stock; with
    XLKV_EQUAL_TP=true xlkv packs the groups and the handshake refuses the pair, naming the knob."""
    if not (0, 24) <= release_of(vllm_env) < (0, 29):
        pytest.skip("vLLM's packed multi-group allocation exists on 0.24-0.28")
    args = ("--family", "sliding-window", "--d-tp", "2")  # the family's own case: blocks of every KV cache group
    r = harness(vllm_env[1], tmp_path, "swa_1to2", *args, env=XLKV, step_timeout=60)
    _assert_exact_cases(r, 2)
    assert all(x["cross_layer"] is False for x in r["d_ranks"] + r["p_ranks"]), r["d_ranks"]
    assert r["num_regions"] > 1, r["num_regions"]  # stock: one region per shared layer tensor
    _assert_said_kept_for_any_tp(r, "packed multi-group rows")
    equal = harness(vllm_env[1], tmp_path, "swa_1to2_equal", *args, env=dict(XLKV, XLKV_EQUAL_TP="true"),
                    step_timeout=60)
    assert equal["num_regions"] == 1, equal["num_regions"]  # packed: one row per block id
    # vLLM 0.26 itself reports no invalid block ids after a failed handshake of a model with several KV cache
    # groups (a stock decode facing a tagged prefill does the same), so only recv_done here
    _assert_refused_naming_equal_tp(equal, 1, 2, "packed multi-group KV layout", invalid_reported=False)


def test_a_refusal_at_vllms_import_in_a_forked_side_reaches_the_parent(vllm_env, tmp_path):
    """The harness's fork parent of a TP 2 side (worker.side_main) imports vLLM before it forks: a refusal
    there (the shim's unsupported-version refusal, raised at ``import vllm``) must reach the parent as the
    ranks' failure with the shim's words, and no rank may be left behind."""
    once_per_session(vllm_env, "the harness's fork path, not the release's connector")
    r = harness(vllm_env[1], tmp_path, "fatal_before_fork", "--p-tp", "2", "--d-tp", "2", "--case", "noncontig",
                env=dict(XLKV, XLKV_VLLM_VERSION="0.99.0"), step_timeout=30)
    assert r["transfer_verified"] is False and r["tp"]["forked_from_one_process"] in (["p", "d"], [])
    assert "P setup (rank 0): child died: XlkvUnsupportedVersion" in r["_text"], r["_text"][-3000:]
    assert "vLLM 0.99.0 is not supported" in r["_text"], r["_text"][-3000:]
    if r["tp"]["forked_from_one_process"]:  # XLKV_HARNESS_FORK_RANKS=0: each rank fails on its own
        assert "before the fork" in r["_text"], r["_text"][-3000:]


# Refusals at heterogeneous TP (0.29+; prefill TP 1 -> decode TP 2, the model's 2 KV heads): each names the real
# cause once and a fix that works.  One noncontig case each (the first request is refused at its handshake);
# the layout paths are 0.29+ only, so they run on the newest CI release.

def _hetero_refusal(vllm_env, tmp_path, name, *args, env=None):
    """The refused run and decode's refusal of the noncontig case (one message)."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("KV cache layouts exist from vLLM 0.29")
    r = harness(vllm_env[1], tmp_path, name, "--d-tp", "2", "--case", "noncontig", *args, env=env, step_timeout=60)
    assert r["transfer_verified"] is False
    assert "xlkv_autopatch: NIXL handshake refused" in (r["cases"]["noncontig"].get("failure_reason") or ""), \
        r["errors"]
    # the case's failure_reason is cut at 1500 characters; the run's errors hold the whole message
    messages = {e.split("XlkvMismatchError: ", 1)[1].split("\n", 1)[0] for e in r["errors"]
                if "XlkvMismatchError: " in e}
    assert len(messages) == 1, messages  # the same refusal for every attempt
    return r, messages.pop()


def test_explicit_token_major_rows_on_prefill_only_name_the_variable(vllm_env, tmp_path):
    """VLLM_KV_CACHE_LAYOUT=BLNHC on prefill only, the flag on both: the refusal said "set ENABLE_XLKV=true on
    BOTH" although it was set on both; the cause is the variable (xlkv requests BHLNC for this model), the fix
    unsetting it there (the default run of this file, test_xlkv_tp1_to_tp2_follows_the_release_rule)."""
    r, message = _hetero_refusal(vllm_env, tmp_path, "p_blnhc", "--p-env", "VLLM_KV_CACHE_LAYOUT=BLNHC", env=XLKV)
    assert "the remote engine runs xlkv's token-major BLNHC block rows (ENABLE_XLKV=true; for a model whose KV " \
           "heads are split over ranks that means an explicit VLLM_KV_CACHE_LAYOUT=BLNHC" in message, message
    assert message.endswith("Fix: unset VLLM_KV_CACHE_LAYOUT on the remote engine, so that both run xlkv's BHLNC "
                            "rows (they serve any TP pairing)"), message
    assert "set ENABLE_XLKV=true on BOTH" not in message, message


def test_explicit_token_major_rows_on_both_name_the_variable_as_the_fix(vllm_env, tmp_path):
    """VLLM_KV_CACHE_LAYOUT=BLNHC on both, the flag on both: the refusal said "unset ENABLE_XLKV on both", and
    stock vLLM refuses BLNHC rows at heterogeneous TP too ("requires contiguous heads"); unsetting the variable
    is the fix that works (xlkv's BHLNC rows)."""
    r, message = _hetero_refusal(vllm_env, tmp_path, "both_blnhc", "--env", "VLLM_KV_CACHE_LAYOUT=BLNHC", env=XLKV)
    assert message.startswith("xlkv_autopatch: NIXL handshake refused: prefill TP 1, decode TP 2: token-major "
                              "block-outermost rows (BLNHC"), message
    assert "Fix: unset VLLM_KV_CACHE_LAYOUT on both engines (VLLM_KV_CACHE_LAYOUT=BLNHC is set explicitly and wins" \
           in message and "unset ENABLE_XLKV" not in message, message


def test_flag_on_decode_only_at_hetero_tp_gives_a_fix_that_works(vllm_env, tmp_path):
    """ENABLE_XLKV on decode only: the fix said "an explicit VLLM_KV_CACHE_LAYOUT=BLNHC there may stay", which
    gives the remote token-major rows that this engine's BHLNC rows refuse (and vLLM refuses at heterogeneous
    TP with or without xlkv)."""
    r, message = _hetero_refusal(vllm_env, tmp_path, "d_flag", "--d-env", "ENABLE_XLKV=true")
    assert "may stay" not in message, message
    assert "Fix: set ENABLE_XLKV=true on the remote engine as well, and remove there the cause its log names " \
           "(VLLM_KV_CACHE_LAYOUT: unset it, or set BHLNC" in message, message
    assert message.endswith("or unset ENABLE_XLKV on both (vLLM then serves this TP pairing only with the same "
                            "attention kernel block on both and without VLLM_KV_CACHE_LAYOUT=BLNHC on either "
                            "side)"), message


def test_explicit_stock_layout_on_decode_only_is_named_once(vllm_env, tmp_path):
    """VLLM_KV_CACHE_LAYOUT=NHD on decode only, the flag on both: the cause was printed twice, and the fix
    offered "unset ENABLE_XLKV on the remote", which leaves two different stock layouts."""
    r, message = _hetero_refusal(vllm_env, tmp_path, "d_nhd", "--d-env", "VLLM_KV_CACHE_LAYOUT=NHD", env=XLKV)
    assert message.count("VLLM_KV_CACHE_LAYOUT=NHD is set explicitly and wins") == 1, message
    assert message.endswith("Fix: unset VLLM_KV_CACHE_LAYOUT on this engine, so that both engines run xlkv's "
                            "layout"), message


def test_a_smaller_kernel_block_on_decode_only_names_the_block_size_that_works(vllm_env, tmp_path, xlkv_1to2):
    """--block-size 32 on both, an attention kernel block of 16 on decode only, the flag on both: the fix "unset
    ENABLE_XLKV on the remote" ends in stock vLLM's bare AssertionError (its block sizes at heterogeneous TP);
    --block-size 16 on both, the fix named, is this file's default run (xlkv_1to2: 16-token blocks, xlkv's rows
    on every rank, exact bytes)."""
    r, message = _hetero_refusal(vllm_env, tmp_path, "d_kernel16", "--p-block-size", "32", "--d-block-size", "32",
                                 "--d-kernel-block-size", "16", env=XLKV)
    assert message.count("the attention kernel block (16 tokens) is smaller than the KV block (32 tokens)") == 1, \
        message
    assert message.endswith("Fix: set --block-size 16 (the attention kernel block) on both engines, so that both "
                            "run xlkv's layout (the stock layout on both does not serve 16-token kernel blocks facing "
                            "32-token blocks either)"), message
    fixed = xlkv_1to2  # the fix: 16-token blocks (the harness's default) on both
    assert fixed["block_len"] and fixed["errors"] == [] and fixed["transfer_verified"] is True, fixed["errors"]
    assert all(x["cross_layer"] is True for x in fixed["d_ranks"] + fixed["p_ranks"]), fixed["d_ranks"]
