"""Real prefill->decode transfers through vLLM's own NixlConnector code and real NIXL (UCX on
host memory), per release: stock vs ENABLE_XLKV, byte-for-byte, and the one-sided-flag
refusals.  The harness (tests/harness/pd_harness.py) runs P and D as two processes and does
what the release's GPU model runner does; it never looks at the shim."""

import json
import os

import pytest

from conftest import harness, once_per_session, release_of, run_in



@pytest.fixture(scope="module")
def stock(vllm_env, tmp_path_factory):
    return harness(vllm_env[1], tmp_path_factory.mktemp("stock"), "stock")


@pytest.fixture(scope="module")
def xlkv(vllm_env, tmp_path_factory):
    # D's first request goes to a second prefill without the flag, which D must refuse (flag on
    # decode only); then the cases run against the flagged prefill on the same D
    return harness(vllm_env[1], tmp_path_factory.mktemp("xlkv"), "xlkv", "--refused-peer-env", "ENABLE_XLKV=false",
                   env={"ENABLE_XLKV": "true"})


def test_stock_transfer_is_per_layer_and_correct(vllm_env, stock):
    assert stock["errors"] == [] and stock["transfer_verified"] is True, stock["errors"]
    assert stock["cross_layer"] is False
    assert stock["descs_per_block"] >= 4  # one per layer (4 layers), K/V split on older releases
    assert "xlkv_autopatch" not in stock["_log"]


def test_xlkv_transfer_is_cross_layer_and_byte_identical(vllm_env, stock, xlkv):
    assert xlkv["errors"] == [] and xlkv["transfer_verified"] is True, xlkv["errors"]
    assert xlkv["cross_layer"] is True
    assert 1 <= xlkv["descs_per_block"] <= 2 < stock["descs_per_block"]
    for name, case in xlkv["cases"].items():
        assert case["ok"] and case["bytes_ok"], (name, case)
        assert case["xfer_descs_per_block"] == xlkv["descs_per_block"], (name, case)
    # same bytes per block moved either way
    assert xlkv["block_len"] * xlkv["num_regions"] == stock["block_len"] * stock["num_regions"]
    # both sides said what they did in vLLM's log (captured from vLLM's logger tree; on 0.33
    # the capture was empty until the harness set the "vllm" logger's level itself)
    for side in ("p", "d"):
        said = json.dumps(xlkv[side]["xlkv_log"])
        assert "NIXL registration: 1 region(s), 40 blocks, cross-layer layout" in said, (side, said[-2000:])
        assert "list their descriptor pairs in ascending local order" in said, (side, said[-2000:])


def test_flag_on_decode_only_is_refused_with_the_cause_and_decode_serves_on(vllm_env, xlkv):
    # the xlkv run's first request: a prefill without the flag, refused by D's shim with the cause
    refused = refused_peer(xlkv)
    assert "d_died" not in refused and "no_answer" not in refused, said(refused)
    text = json.dumps(refused.get("errors"))
    assert "NIXL handshake refused" in text and "ENABLE_XLKV unset there" in text, said(refused)
    # the request failed (its blocks invalid, nothing handed to NIXL) and D served the next one
    assert refused["recv_done"] is True and refused["invalid_block_ids"] == [23, 24, 25], said(refused)
    assert not refused["xfer_calls"], said(refused)
    assert xlkv["errors"] == [] and xlkv["transfer_verified"] is True, xlkv["errors"]


def test_flag_on_prefill_only_never_transfers(vllm_env, tmp_path):
    # a stock decode (no shim there) facing a flagged prefill: vLLM's own handshake check on D
    # refuses it, and the remote hash it prints is the shim's tag (0.13+; 0.12 has no hash)
    r = harness(vllm_env[1], tmp_path, "p_only", "--case", "noncontig", "--p-env", "ENABLE_XLKV=1")
    assert r["transfer_verified"] is False
    case = r["cases"]["noncontig"]
    assert case["ok"] is False and not case.get("xfer_descs"), case  # no descriptor reached NIXL
    if release_of(vllm_env) >= (0, 13):
        reason = case.get("failure_reason") or ""  # D's exception
        assert "compatibility hash mismatch" in reason, reason
        assert "Remote: xlkv-cross-layer-KV-layout.sent-by-an-engine-with-ENABLE_XLKV=true." in reason, reason


def test_flag_on_prefill_only_the_stock_decode_dies_on_0_12_to_0_21_and_status_says_so(vllm_env, tmp_path):
    """The documented hazard: D runs stock (no flag, so no shim guard there) and its
    first request goes to a prefill with ENABLE_XLKV=true.  D refuses that handshake itself (the
    tagged hash).  On 0.12-0.21 vLLM's own get_finished then looks the refused engine up and D's
    worker dies (KeyError); from 0.22 vLLM skips failed receives and D serves the next request from a
    stock prefill.  status, run on D's side (flag off), names the hazard exactly where it is."""
    r = harness(vllm_env[1], tmp_path, "flagged_peer", "--case", "noncontig", "--refused-peer-block-size", "16",
                "--refused-peer-env", "ENABLE_XLKV=true")
    refused = r.get("refused_peer") or {}
    status = run_in(vllm_env[1], ["-m", "xlkv_autopatch", "status", "--no-resolve"], timeout=300)
    hazard = [l for l in status.stdout.splitlines() if l.startswith("NOTE: ") and "KeyError" in l]
    if release_of(vllm_env) <= (0, 21):
        died = refused.get("d_died") or ""
        assert "KeyError: 'p-refused-engine'" in died and "in get_finished" in died, (refused, r["_log"][-3000:])
        assert len(hazard) == 1 and "if the peer engine has ENABLE_XLKV=true" in hazard[0], status.stdout
    else:
        assert "d_died" not in refused, refused.get("d_died")
        assert refused["recv_done"] is True and refused["invalid_block_ids"] and not refused["xfer_calls"], refused
        assert "compatibility hash mismatch" in json.dumps(refused["errors"]), refused
        assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]  # D kept serving
        assert hazard == [], status.stdout


def refused_peer(r):
    """The harness's record of the request D had to refuse; a run that has none fails with the harness's
    errors and the machine's load (a set-up that ran out on a loaded machine is load, not a finding)."""
    refused = r.get("refused_peer")
    assert refused, "the harness recorded no refused-peer request; its errors: %s; load average %s on %d cores" % (
        json.dumps(r.get("errors"))[-3000:], "/".join("%.1f" % x for x in os.getloadavg()), os.cpu_count() or 0)
    return refused


def said(refused):
    """What an assertion on the refused request shows: everything the harness kept about it (what it
    waited for and how long where nothing came back, D's errors and shim lines, the request's outcome)."""
    return json.dumps(refused, default=str)[-4000:]


def _shim_log(r):
    return json.dumps([r.get("p", {}).get("xlkv_log"), r.get("d", {}).get("xlkv_log")]) + r["_log"]


def test_block_size_refusal_fails_the_request_and_the_engine_keeps_serving(vllm_env, tmp_path):
    """D first gets a request from a prefill whose blocks D's cannot hold a whole number of, which the
    handshake must refuse with the cause; that request must fail and D keep serving: the next request,
    from a prefill with D's block size, transfers exactly on the same D processes.  Up to 0.28: P 16,
    D 32, the direction vLLM itself lets through (it re-splits remote blocks), refused by xlkv's guard
    (a cross-layer block cannot be re-split).  0.29+, where xlkv serves that direction
    (test_different_block_sizes_served): P 32, D 16, which vLLM refuses too, named with vLLM's cause.
    (0.12-0.21: vLLM's failure path looked the refused engine up, KeyError, and the decode worker died.)"""
    served = release_of(vllm_env) >= (0, 29)
    d_bs, peer_bs = (16, 32) if served else (32, 16)
    r = harness(vllm_env[1], tmp_path, "bs_mismatch", "--case", "noncontig", "--p-block-size", str(d_bs),
                "--d-block-size", str(d_bs), "--refused-peer-block-size", str(peer_bs), env={"ENABLE_XLKV": "true"})
    refused = refused_peer(r)
    assert "d_died" not in refused and "no_answer" not in refused, said(refused)
    text = json.dumps(refused.get("errors"))
    assert "NIXL handshake refused" in text and "registers %d-token blocks with NIXL" % peer_bs in text, said(refused)
    if served:  # vLLM's own cause, named as vLLM's
        assert "refuses 16-token blocks here facing 32-token blocks there with or without xlkv" in text, said(refused)
    # the request failed: finished with its blocks invalid, nothing handed to NIXL
    assert refused["recv_done"] is True and refused["invalid_block_ids"] == [23, 24, 25], said(refused)
    assert not refused["xfer_calls"], said(refused)
    # and the engine kept serving: the compatible prefill's request arrived byte for byte (the
    # refused request's blocks 23-25 checked untouched)
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    assert r["cases"]["noncontig"]["ok"] and r["cases"]["noncontig"]["bytes_ok"], r["cases"]


#: prefill TP, decode TP, prefill and decode block sizes: the pairings xlkv serves on 0.29+; CI runs two
#: (about 90 s each), XLKV_TEST_EVERYWHERE=1 all four
BLOCK_SIZE_PAIRS = [(1, 2, 16, 32, True), (1, 1, 16, 64, True), (1, 1, 16, 32, False), (1, 2, 16, 64, False)]


@pytest.mark.parametrize("p_tp,d_tp,p_bs,d_bs,in_ci", BLOCK_SIZE_PAIRS,
                         ids=["tp%dto%d-%d-%d" % row[:4] for row in BLOCK_SIZE_PAIRS])
def test_different_block_sizes_served(vllm_env, tmp_path, p_tp, d_tp, p_bs, d_bs, in_ci):
    """0.29+, ENABLE_XLKV=true on both: decode blocks holding R prefill blocks are served
    (layout.block_sizes_served at the handshake, patches/block_size_restage.py on receive): every decode
    rank's bytes equal prefill's token by token (harness blocksizes.py: a whole and a partial request, the
    untransferred tail zero), at R descriptors per decode block per remote rank (stock: R per layer)."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("vLLM %s's cross-layer blocks are refused with other block sizes (the refusal test)"
                    % vllm_env[0])
    if not in_ci and os.environ.get("XLKV_TEST_EVERYWHERE", "").strip() not in ("1", "true", "yes", "on"):
        pytest.skip("CI time: two pairings run in CI, XLKV_TEST_EVERYWHERE=1 runs this one too")
    args = ["--p-block-size", str(p_bs), "--d-block-size", str(d_bs)]
    if d_tp != 1 or p_tp != 1:
        args += ["--p-tp", str(p_tp), "--d-tp", str(d_tp)]
    r = harness(vllm_env[1], tmp_path, "bs_%d_%d" % (p_bs, d_bs), *args, env={"ENABLE_XLKV": "true"},
                step_timeout=60)
    assert r["kv_layout"] == "BHLNC" and r["num_regions"] == 1, (r.get("kv_layout"), r.get("num_regions"))
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    ratio = d_bs // p_bs
    assert set(r["cases"]) == {"bs-full", "bs-partial"}, sorted(r["cases"])
    for name, case in r["cases"].items():
        assert case["ok"] and case["bytes_ok"] and case["num_mismatches"] == 0, (name, case)
        ranks = case["ranks"] if d_tp > 1 else [case]  # the harness lists ranks at D TP > 1 only
        assert len(ranks) == d_tp and all(x["bytes_ok"] and x["num_mismatches"] == 0 for x in ranks), (name, case)
        if name == "bs-full":  # every decode block whole: R descriptors per decode block per remote rank
            assert [x["xfer_descs_per_block"] for x in ranks] == [ratio] * d_tp, (case, ratio)


def test_host_buffer_mode_keeps_the_stock_layout_with_a_warning(vllm_env, tmp_path):
    r = harness(vllm_env[1], tmp_path, "host_buffer", "--case", "noncontig", "--kv-buffer-device", "cpu",
                env={"ENABLE_XLKV": "true"})
    shim_log = _shim_log(r)
    assert "the stock per-layer KV layout is kept: host-buffer mode" in shim_log, shim_log[-3000:]
    assert r["cross_layer"] is False


def test_host_buffer_mode_with_strict_is_an_error(vllm_env, tmp_path):
    # XLKV_STRICT turns every stock fallback into the same error (shim code, the same on every release)
    once_per_session(vllm_env, "XLKV_STRICT's error is the fallback's own code on every release")
    strict = harness(vllm_env[1], tmp_path, "host_buffer_strict", "--case", "noncontig", "--kv-buffer-device",
                     "cpu", env={"ENABLE_XLKV": "true", "XLKV_STRICT": "1"})
    assert strict["transfer_verified"] is False
    assert "XLKV_STRICT=1 makes this an error" in json.dumps(strict["errors"]) + strict["_log"]


def test_v1_model_runner_forced_where_v2_is_the_default(vllm_env, stock, xlkv):
    if not ((0, 23) <= release_of(vllm_env) < (0, 29)):
        pytest.skip("Model Runner V2 is not the default for this model on vLLM %s" % vllm_env[0])
    assert stock["p"]["use_v2_model_runner"] is True
    assert xlkv["p"]["use_v2_model_runner"] is False
    assert "using the V1 model runner" in json.dumps(xlkv["p"].get("xlkv_log")) + xlkv["_log"]


def test_multiconnector_and_plain_nixlconnector_make_the_same_decision(vllm_env, tmp_path):
    # NixlConnector inside a MultiConnector on one side, a plain NixlConnector on the other (the
    # dynamo #10027 pairing). Before 0.16 vLLM's MultiConnector does not pass on the NIXL
    # handshake metadata, so it cannot be the prefill side there (stock too): it is the decode side.
    p_multi = release_of(vllm_env) >= (0, 16)
    side = "--p-connector" if p_multi else "--d-connector"
    r = harness(vllm_env[1], tmp_path, "multi", side, "multi", env={"ENABLE_XLKV": "true"})
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    multi = r["p" if p_multi else "d"]
    assert multi["connector_class"].endswith("MultiConnector"), multi["connector_class"]
    assert r["p"]["cross_layer"] is True and r["d"]["cross_layer"] is True
    assert r["p_d_layout_match"] is True
    for case in r["cases"].values():
        assert case["xfer_descs_per_block"] == 1, case


def test_multiconnector_with_a_child_that_takes_no_cross_layer_blocks(vllm_env, tmp_path):
    # MultiConnector(NixlConnector, example storage connector) on decode, plain NixlConnector on
    # prefill: never a transfer. 0.12-0.28: the MultiConnector side keeps the stock layout (its
    # other child takes no cross-layer blocks) and says so in a WARNING; the handshake is refused,
    # by xlkv with the cause named where the two hashes differ only by the layout (0.13-0.21) or,
    # without a hash, where the registered regions differ (0.12); 0.22+ also hash whether the
    # hybrid KV manager is on, which the example connector turns off (stock vLLM refuses this
    # pairing too): xlkv names the connector configuration there.
    r = harness(vllm_env[1], tmp_path, "multi_mixed", "--case", "noncontig", "--d-connector", "multi-mixed",
                env={"ENABLE_XLKV": "true"})
    assert r["transfer_verified"] is False
    text = _shim_log(r) + json.dumps(r["errors"])
    if release_of(vllm_env) < (0, 29):
        assert r["d"]["cross_layer"] is False and r["p"]["cross_layer"] is True
        assert "also runs ExampleConnector" in text or "also runs SharedStorageConnector" in text, text[-3000:]
    if release_of(vllm_env) < (0, 13):  # no hash: xlkv compares the registered regions
        assert "NIXL handshake refused: this engine runs the stock per-layer KV layout" in text, text[-3000:]
        assert "this engine registered 8 region(s), the remote engine 1" in text, text[-3000:]
    elif release_of(vllm_env) < (0, 22):
        assert "NIXL handshake refused: this kv_both engine runs the stock per-layer KV layout" in text, text[-3000:]
        assert "remote engine runs xlkv's cross-layer KV layout" in text
    else:
        # vLLM's hash differs by more than the layout (the hybrid KV cache manager that the example
        # connector turns off): xlkv names the connector configuration, not "model, dtype, block size"
        assert "NIXL handshake refused" in text, text[-3000:]
        assert "vLLM's hybrid KV cache manager is off on this engine" in text, text[-3000:]
        assert "hybrid KV cache manager" in text and "KV connector list" in text, text[-3000:]
        assert "block size" not in text.split("NIXL handshake refused", 1)[1][:1500], text[-3000:]


def test_kernel_block_smaller_than_the_logical_block(vllm_env, tmp_path):
    # the backend supports only 16-token kernel blocks, the KV manager uses 32-token blocks:
    # vLLM's own prepare_kernel_block_sizes splits every logical block in two
    r = harness(vllm_env[1], tmp_path, "kernel_block", "--kernel-block-size", "16", "--p-block-size", "32",
                "--d-block-size", "32", env={"ENABLE_XLKV": "true"})
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    # what the release did, not what the harness asked for: its allocation holds 2 kernel blocks
    # per logical block (80 for the harness's 40), and its NIXL worker derived the same ratio
    assert 2 * 40 in r["d"]["layer_view_shape"] and 40 not in r["d"]["layer_view_shape"], r["d"]["layer_view_shape"]
    if release_of(vllm_env) >= (0, 14):  # the worker computes it from the registered tensors
        assert r["d"]["worker"].get("_physical_blocks_per_logical_kv_block") == 2, r["d"]["worker"]
    if release_of(vllm_env) >= (0, 29):
        # vLLM cannot register a block-outermost layout split into kernel blocks (its own
        # assertion): the stock layout, with the reason in one WARNING
        assert r["cross_layer"] is False
        assert "kernel block (16 tokens) is smaller than the KV block (32 tokens)" in _shim_log(r)
        return
    assert r["cross_layer"] is True
    for name, case in r["cases"].items():
        # one descriptor per kernel block: two per logical block, each a whole cross-layer row
        assert case["bytes_ok"] and case["xfer_descs_per_block"] == 2, (name, case)


def test_over_allocated_tensors(vllm_env, tmp_path):
    # the allocator hands over tensors with 10 blocks more than the scheduler's budget (virtual
    # capacity, as kvcached does)
    r = harness(vllm_env[1], tmp_path, "over_alloc", "--over-allocate", "10", env={"ENABLE_XLKV": "true"})
    rel = release_of(vllm_env)
    if rel >= (0, 29):
        # vLLM's own registration fails on the block-outermost view ("cannot be partitioned into NIXL
        # regions"), before any metadata is published; xlkv names the cause, the over-allocation
        # (the text named the partition failure), and the fix
        assert r["transfer_verified"] is False
        text = json.dumps(r["errors"])
        assert "the KV tensors are over-allocated, they hold 50 blocks and the scheduler budget " \
               "(kv_cache_config.num_blocks) is 40" in text, text[-3000:]
        assert "Fix: allocate exactly kv_cache_config.num_blocks blocks, or unset ENABLE_XLKV" in text
        assert "vLLM cannot register this KV cache" not in text and "VLLM_KV_CACHE_LAYOUT=LBHNC" not in text
        return
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    assert r["d"]["tensor_blocks"] == 50 and r["cross_layer"] is True
    if rel >= (0, 18):
        # vLLM takes the count from the budget (and asserts it equals the tensors'): the shim
        # raised it to the tensors' real block count before registration
        assert "tensors hold 50 blocks, the scheduler budget is 40" in json.dumps(r["d"]["xlkv_log"]), r["d"]
        assert r["d"]["worker"]["num_blocks"] == 50
    # a transfer of blocks beyond the budget (ids 40-49, which only the tensors hold) was exact
    assert r["cases"]["virtual"]["ok"] is True, r["cases"]["virtual"]


def test_regions_that_disagree_on_their_block_count_are_refused(vllm_env, tmp_path):
    """D's connector worker is handed, at registration, regions that disagree on their block count
    (--plant-fault uneven-regions: the cross-layer tensor plus a view one block shorter; 0.29+: the
    first layer's view one block short).  vLLM 0.12-0.17 take the count from the first region and
    check no other, so without xlkv's refusal (patches/block_count.py) they register them and the
    run completes (removing the refusal passed every test; on 0.14.1 this run then
    verified its transfer).  Refused at D's registration, before any metadata is published."""
    r = harness(vllm_env[1], tmp_path, "uneven", "--case", "noncontig", "--plant-fault", "uneven-regions",
                env={"ENABLE_XLKV": "true"})
    text = json.dumps(r["errors"])
    assert r["transfer_verified"] is False and r["cases"] == {}, (r["cases"], text[-3000:])
    assert "D setup" in text, text[-3000:]
    disagree = ("refusing to register the KV cache with NIXL: tensors disagree on their block count" in text
                and "and this vLLM indexes every region with one count" in text)
    if release_of(vllm_env) < (0, 29):
        assert disagree, text[-3000:]
    else:
        # 0.29+ register per-layer views: xlkv's check where vLLM indexes every region with one
        # count, or (0.33, a count per region) vLLM's own check, named by xlkv with the fix
        assert disagree or ("vLLM cannot register this KV cache with NIXL in the block-outermost layout" in text
                            and "KV cache tensor has too few blocks" in text), text[-3000:]


#: the harness's block orders of a loaded server -> descriptors NIXL may move per cross-layer
#: descriptor of a block once xlkv ordered the pairs (patches/transfer_order.py)
ORDER_CASES = {"reversed": 1, "interleaved": 2, "shared": 1}


def test_block_orders_of_a_loaded_server_merge_with_the_shim_and_stay_as_vllm_lists_them_in_stock(
        vllm_env, stock, xlkv):
    """NIXL's own telemetry (descCount, what vLLM's KV metrics print) per case: with xlkv,
    blocks descending on both sides become one descriptor, two interleaved runs two, and a
    prefix-cache hit on D (4 of P's 6 blocks) one; stock keeps one per block and region."""
    for case, merged in ORDER_CASES.items():
        x, s = xlkv["cases"][case], stock["cases"][case]
        assert x["bytes_ok"] and s["bytes_ok"], (case, x, s)
        assert "nixl_descs" in x and "nixl_descs" in s, "vLLM read no NIXL telemetry: %s" % case
        blocks = len(x["local_block_ids"])
        assert x["nixl_descs"] == merged * xlkv["descs_per_block"], (case, x["nixl_descs"])
        assert s["nixl_descs"] == blocks * stock["descs_per_block"], (case, s["nixl_descs"])


def _has_push_connector(python):
    r = run_in(python, ["-c", "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory "
                              "as F; print('NixlPushConnector' in getattr(F, '_registry', {}))"])
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1] == "True"


def test_push_connector_writes_exact_bytes_with_the_pairs_ordered(vllm_env, tmp_path):
    """vLLM's NixlPushConnector (P WRITEs into D's blocks) with the shim: the WRITE path of
    patches/transfer_order.py on real vLLM + NIXL. Bytes compared on D; descriptors counted on
    P's agent, which makes the transfer (D's makes none)."""
    once_per_session(vllm_env, "one release runs the push path (the compat matrix runs every release that has it)")
    if not _has_push_connector(vllm_env[1]):
        pytest.skip("vLLM %s has no NixlPushConnector" % vllm_env[0])
    cases = ["noncontig"] + list(ORDER_CASES)
    if release_of(vllm_env) < (0, 33):
        # measured on 0.26.0 (compat matrix, push.vllm_failures): on a D-side prefix hit stock vLLM's
        # push pairs D's blocks with P's first blocks, not its last, so "shared" is wrong with and
        # without the shim; 0.33.0 trims P's list from the end
        cases.remove("shared")
    r = harness(vllm_env[1], tmp_path, "push", "--transfer", "push", *[a for c in cases for a in ("--case", c)],
                env={"ENABLE_XLKV": "true"})
    assert r["errors"] == [] and r["transfer_verified"] is True, r["errors"]
    for side in ("p", "d"):
        assert r[side]["connector_class"].endswith(".NixlPushConnector"), r[side]["connector_class"]
    assert r["cross_layer"] is True and r["descs_per_block"] == 1
    blocks = {"noncontig": 4, "reversed": 8, "interleaved": 6, "shared": 4}
    merged = dict(ORDER_CASES, noncontig=4)  # noncontig: 4 blocks that continue nowhere
    assert sorted(r["cases"]) == sorted(cases)
    for name, case in r["cases"].items():
        assert case["transfer"] == "push" and case["bytes_ok"] and case["p_done_sending"], (name, case)
        assert case["d_xfer_calls"] == [], (name, case)  # D made no transfer: P wrote
        assert case["xfer_descs"] == blocks[name], (name, case)  # what vLLM listed, one per block
        assert case["nixl_descs"] == merged[name], (name, case)  # what NIXL moved after the ordering
