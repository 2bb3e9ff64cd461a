"""Model families beyond the dense tiny Llama, on real vLLM + real NIXL (the CPU P/D harness,
``--family``; shapes in tests/harness/pdharness/model.py):

- mla: DeepSeek-V2-shaped MLA (one 576-wide latent cache per layer, use_mla in the config),
- sliding-window: gpt-oss-shaped sliding-window + full hybrid (the planner makes several KV cache groups;
  the sliding-window group pulls only its in-window tail),
- one-kv-head: one KV head (MQA) (TP 1: the one-KV-head-per-rank registration).

Per family: bytes exact, stock and with ENABLE_XLKV=true (every KV cache group checked). On
0.29+ the descriptor targets, from what D's vLLM registered and from the one
transfer: flag on <= vLLM's own best setting (native: VLLM_KV_CACHE_LAYOUT=BLNHC on both
sides), 1 descriptor per block for MLA, 1 per block id for sliding-window hybrids and 1 per
block at one KV head (patches/page_contiguous.py; TP 2 -> 2 in test_hetero_tp.py; the
one-kv-head xlkv run's first request is the mixed pair, a prefill on vLLM's own BLNHC, refused). One
harness run per family and config (a single request carrying every group's block ids): on 0.29+
releases (CI's time), 8 runs per release (native for mla and sliding-window) and 1 (the planted fault) on the
newest selected.
On 0.24-0.28 the sliding-window family only, stock and xlkv (2 runs; xlkv with XLKV_EQUAL_TP=true,
which packing needs since shim 0.8.0): the flag packs the
sliding-window and full-attention groups as vLLM's own opt-in (enable_cross_layers_blocks) does,
1 descriptor per block id, the figure vLLM's opt-in registered in the results file of the release
(NATIVE_FIGURES; measured once, not in CI), and D's compatibility hash is tagged.
On 0.26-0.28 the mla family too, stock and xlkv (2 runs): the flag gives vLLM's
MLA backends that read their latent cache by the block stride (TRITON_MLA on the CPU harness) one
cross-layer latent tensor, 1 descriptor per block where stock registers one per layer, which no vLLM
setting does on these releases; the xlkv run's first request goes to an unflagged prefill, refused.
experiments/cpu/families_matrix.py writes the same runs into a results file."""

import importlib.util
import json
import os

import pytest

from conftest import ROOT, harness, once_per_session, release_of
from xlkv_autopatch.families import canonical

FAMILIES = ("mla", "sliding-window", "one-kv-head")
CONFIGS = {"stock": ((), {}), "xlkv": ((), {"ENABLE_XLKV": "true"}),
           "native": (("--env", "VLLM_KV_CACHE_LAYOUT=BLNHC"), {})}
#: 0.24-0.28: vLLM's own opt-in for several KV cache groups (its packed multi-group allocation)
PACKED_NATIVE = (("--native-opt-in",), {})
#: the releases whose packed multi-group allocation the shim turns on for sliding-window hybrids
PACKED = ((0, 24), (0, 29))
#: descriptors per block id vLLM's own opt-in registered for the sliding-window family, by release: measured
#: once (families_matrix.py --config native), read from the results file, not re-run in CI
NATIVE_FIGURES = {"0.26.0": "experiments/results/2026-11-25-families-cpu-0.26.0.json"}


#: 0.24-0.28: the flag packs a sliding-window hybrid's KV cache groups only with XLKV_EQUAL_TP=true (packed rows
#: cannot be sliced by KV heads; without it the hybrid keeps the stock layout: tests/real/test_hetero_tp.py)
EQUAL_TP = {"XLKV_EQUAL_TP": "true"}


#: the one-kv-head xlkv run's first request goes to a second prefill on vLLM's own BLNHC without the flag
#: (one region per layer), which the flagged decode (one region per row) must refuse
MIXED_PAIR = ("--refused-peer-env", "ENABLE_XLKV=false", "--refused-peer-env", "VLLM_KV_CACHE_LAYOUT=BLNHC")


#: the mla xlkv run's first request on 0.26-0.28 goes to a second prefill without the flag (per-layer
#: latent regions), which the flagged decode (one cross-layer latent tensor) must refuse
MLA_MIXED_PAIR = ("--refused-peer-env", "ENABLE_XLKV=false")


def _packed_release(vllm_env):
    return PACKED[0] <= release_of(vllm_env) < PACKED[1]


#: the releases where xlkv gives MLA one cross-layer latent tensor, written here and
#: not read from releases.py, so that a release table that drops it fails these tests
MLA_CROSS_LAYER = ((0, 26), (0, 29))


def _mla_cross_layer_release(vllm_env):
    return MLA_CROSS_LAYER[0] <= release_of(vllm_env) < MLA_CROSS_LAYER[1]


@pytest.fixture(scope="module")
def runs(vllm_env, tmp_path_factory):
    """(family, config) -> the harness result, run on first use and kept for the module.
    XLKV_FAMILIES_RESULTS=FILE: afterwards the runs go into FILE as families_matrix.py
    writes them (experiments/results/2026-11-25-families-cpu-<release>.json)."""
    if release_of(vllm_env) < (0, 29) and not _packed_release(vllm_env) and not _mla_cross_layer_release(vllm_env):
        # CI's time: the family targets are 0.24+'s; on 0.12-0.23 the shim keeps MLA and several KV
        # cache groups on the stock layout (families.decide, tests/unit/test_families.py)
        pytest.skip("model families run on vLLM 0.24+ (the releases whose allocation or layouts they change)")
    cache = {}

    def get(family, config, *extra):
        key = (family, config) + extra
        if release_of(vllm_env) < (0, 29) and not (
                (family == "sliding-window" and config in ("stock", "xlkv", "native"))
                or (family == "mla" and config in ("stock", "xlkv") and _mla_cross_layer_release(vllm_env))):
            pytest.skip("on vLLM 0.24-0.28 the sliding-window hybrid runs (its KV cache groups "
                        "are packed) and, on 0.26-0.28, MLA (item 2); the rest keeps its 0.24-0.28 layout, "
                        "tests/unit/test_families.py")
        if key not in cache:
            args, env = PACKED_NATIVE if config == "native" and release_of(vllm_env) < (0, 29) else CONFIGS[config]
            if key == ("one-kv-head", "xlkv"):
                args = args + MIXED_PAIR
            if key == ("mla", "xlkv") and release_of(vllm_env) < (0, 29):
                args = args + MLA_MIXED_PAIR
            if key == ("sliding-window", "xlkv") and _packed_release(vllm_env):
                env = dict(env, **EQUAL_TP)  # packed only where every peer runs this TP size (shim 0.8.0)
            cache[key] = harness(vllm_env[1], tmp_path_factory.mktemp("%s-%s" % (family, config)),
                                 "%s-%s" % (family, config), "--family", family, "--case", "groups",
                                 *args, *extra, env=env)
        return cache[key]
    yield get
    out = os.environ.get("XLKV_FAMILIES_RESULTS")
    if out:
        spec = importlib.util.spec_from_file_location(
            "families_matrix", os.path.join(ROOT, "experiments", "cpu", "families_matrix.py"))
        fm = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fm)
        res = {"vllm": vllm_env[0], "command": "XLKV_FAMILIES_RESULTS=%s pytest tests/real/test_model_families.py" % out,
               "runs": {}}
        for key, r in cache.items():
            res["runs"].setdefault(key[0], {})["-".join(key[1:])] = fm.summarize(r)
        with open(out, "w") as f:
            json.dump(res, f, indent=1)


def _groups_case(r):
    return r["cases"]["groups"]


def _assert_bytes_exact(r, family):
    assert r["errors"] == [] and r["transfer_verified"] is True, (family, r["errors"])
    assert r["family"] == family
    case = _groups_case(r)
    assert case["ok"] and case["bytes_ok"] and case["num_mismatches"] == 0, case
    groups = case["groups"]  # one entry per KV cache group, each checked (never an empty loop)
    assert len(groups) == len(r["kv_cache_groups"]) >= 1, (groups, r["kv_cache_groups"])
    for g in groups:
        assert g["blocks_checked"] > 0 and g["mismatches"] == 0, g


@pytest.mark.parametrize("config", ["stock", "xlkv"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_transfer_is_byte_exact(vllm_env, runs, family, config):
    r = runs(family, config)
    print(json.dumps({"family": family, "config": config, "registered": r["registered"],
                      "sent_per_block_id": _groups_case(r)["xfer_descs_per_block"]}))
    _assert_bytes_exact(r, family)
    reg = r["registered"]
    # the registration's own figures agree with the worker's descriptor count (every release records them)
    assert reg["descs_per_block_id"] == r["descs_per_block"], (reg, r["descs_per_block"])
    if family == "mla":
        # one latent cache per layer: vLLM's MLA path (no K/V split), 576 bf16 per token
        assert r["d"]["worker"]["use_mla"] is True, r["d"]["worker"]
        assert "MLA" in r["backend"], r["backend"]
        assert reg["bytes_per_block_id"] == 4 * 16 * 576 * 2, reg


def test_swa_has_several_groups_and_pulls_only_the_window_tail(vllm_env, runs):
    if release_of(vllm_env) < (0, 29) and not _packed_release(vllm_env):
        once_per_session(vllm_env, "the per-group transfer is a 0.24+ target; earlier releases are recorded")
    r = runs("sliding-window", "stock")
    groups = r["kv_cache_groups"]
    assert len(groups) >= 2, groups  # the hybrid allocator kept the sliding-window layers apart
    case = _groups_case(r)
    by_kind = {g["sliding_window"] is not None: g for g in case["groups"]}
    sw, full = by_kind[True], by_kind[False]
    # window 32 tokens, 16-token blocks: cdiv(32, 16) + 1 = 3 of the prompt's 6 blocks
    assert len(sw["local_block_ids"]) == 3 < len(full["local_block_ids"]) == 6, case["groups"]
    assert case["block_ids"] == sum(len(g["local_block_ids"]) for g in case["groups"])


def _per_block(r):
    """(registered descriptors per block id, descriptors handed to NIXL per block id)."""
    return r["registered"].get("descs_per_block_id", r["descs_per_block"]), _groups_case(r)["xfer_descs_per_block"]


@pytest.mark.parametrize("family", ["mla", "sliding-window"])  # one-kv-head: recorded only, no native run
def test_flag_on_never_more_descriptors_than_vllms_own_setting(vllm_env, runs, family):
    if release_of(vllm_env) < (0, 29):
        pytest.skip("these targets are for 0.29+ (VLLM_KV_CACHE_LAYOUT=BLNHC is vLLM's setting there)")
    native, xlkv = runs(family, "native"), runs(family, "xlkv")
    _assert_bytes_exact(native, family)
    _assert_bytes_exact(xlkv, family)
    reg_x, sent_x = _per_block(xlkv)
    reg_n, sent_n = _per_block(native)
    print(json.dumps({"family": family, "xlkv": [reg_x, sent_x], "native": [reg_n, sent_n],
                      "stock": list(_per_block(runs(family, "stock")))}))
    assert reg_x <= reg_n and sent_x <= sent_n, (family, reg_x, reg_n, sent_x, sent_n)


def test_mla_flag_on_is_one_descriptor_per_block(vllm_env, runs):
    if release_of(vllm_env) < (0, 29):
        pytest.skip("the MLA target is for 0.29+")
    r = runs("mla", "xlkv")
    reg, sent = _per_block(r)
    assert reg == 1 and sent == 1, (reg, sent, r["d"]["xlkv_log"][-3:])


def test_mla_flag_on_is_one_cross_layer_tensor_where_no_vllm_setting_is(vllm_env, runs):
    """0.26-0.28: vLLM's NIXL opt-in accepts no MLA backend, so stock and its own
    best setting register one latent region per layer; with the flag TRITON_MLA (which reads its
    latent cache by the block stride) gets one cross-layer tensor: 1 region, 1 descriptor per
    block, bytes exact, D's hash tagged. The xlkv run's first request went to an unflagged
    prefill: refused at the handshake with the cause, nothing handed to NIXL, D serving on."""
    if not _mla_cross_layer_release(vllm_env):
        pytest.skip("xlkv's MLA cross-layer blocks are for 0.26-0.28 (vLLM's own BLNHC from 0.29)")
    stock, xlkv = runs("mla", "stock"), runs("mla", "xlkv")
    _assert_bytes_exact(stock, "mla")
    _assert_bytes_exact(xlkv, "mla")
    reg_s, sent_s = _per_block(stock)
    reg_x, sent_x = _per_block(xlkv)
    layers = len(xlkv["kv_cache_groups"][0]["layers"])
    assert (reg_s, sent_s) == (layers, layers) and layers > 1, (reg_s, sent_s, layers)
    assert (reg_x, sent_x) == (1, 1) and xlkv["cross_layer"] is True, (reg_x, sent_x, xlkv["d"]["xlkv_log"][-4:])
    assert xlkv["registered"]["bytes_per_block_id"] == stock["registered"]["bytes_per_block_id"], \
        (xlkv["registered"], stock["registered"])
    log = "\n".join(xlkv["d"]["xlkv_log"])
    assert "MLA attention backend %s reads its latent cache by the block stride" % xlkv["backend"] in log, log[-1500:]
    assert "tagged as xlkv-cross-layer-KV-layout" in log, log[-1500:]
    refused = xlkv["refused_peer"]
    assert "d_died" not in refused, refused.get("d_died")
    text = json.dumps(refused["errors"])
    assert "NIXL handshake refused" in text and "the remote engine runs the stock per-layer KV layout" in text, \
        text[-3000:]
    assert refused["recv_done"] is True and refused["invalid_block_ids"] == [23, 24, 25], refused
    assert not refused["xfer_calls"], refused


def test_swa_flag_on_is_one_descriptor_per_block_id(vllm_env, runs):
    if release_of(vllm_env) < (0, 29):
        pytest.skip("the sliding-window target is for 0.29+")
    r = runs("sliding-window", "xlkv")
    reg, sent = _per_block(r)
    assert reg == 1 and sent == 1, (reg, sent, r["kv_cache_groups"])


def test_mqa_flag_on_is_one_descriptor_per_block(vllm_env, runs):
    """One KV head (TP 1): vLLM registers xlkv's BHLNC (as its own BLNHC) as one region per layer there,
    since each layer's page is contiguous; page_contiguous.py has it register each block's row as one
    region."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("the one-KV-head target is for 0.29+")
    r = runs("one-kv-head", "xlkv")
    _assert_bytes_exact(r, "one-kv-head")
    reg, sent = _per_block(r)
    assert r["kv_layout"] == "BHLNC" and reg == 1 and sent == 1, (r["kv_layout"], reg, sent,
                                                                  r["d"]["xlkv_log"][-3:])


def test_mqa_prefill_on_vllms_own_blnhc_is_refused_by_a_flagged_decode(vllm_env, runs):
    """The mixed pair at one KV head: at one KV head vLLM's own BLNHC registers one region per layer
    and the flagged side one per block row, so their descriptors would not line up. The flagged
    decode refuses that prefill at the handshake with the cause, and serves the next request
    (the cases of the same run, against the flagged prefill)."""
    if release_of(vllm_env) < (0, 29):
        pytest.skip("the row registration is for 0.29+")
    r = runs("one-kv-head", "xlkv")
    refused = r["refused_peer"]
    assert "d_died" not in refused, refused.get("d_died")
    text = json.dumps(refused["errors"])
    assert "NIXL handshake refused" in text and "BHLNC block rows, each registered as one NIXL region" in text, \
        text[-3000:]
    assert "VLLM_KV_CACHE_LAYOUT=BLNHC or BHLNC) without ENABLE_XLKV" in text, text[-3000:]
    assert refused["recv_done"] is True and refused["invalid_block_ids"] == [23, 24, 25], refused
    assert not refused["xfer_calls"], refused
    _assert_bytes_exact(r, "one-kv-head")


def test_swa_with_a_nixl_only_multiconnector_on_one_side_packs_alike(vllm_env, tmp_path):
    """0.24-0.28: a prefill whose NixlConnector sits alone in a MultiConnector kept the
    stock layout (WARNING) while a plain decode packed, and the pair was refused naming "a MultiConnector
    with a connector that takes no cross-layer blocks"; stock vLLM serves it. Both sides now pack alike:
    bytes exact, one region per block id."""
    if not _packed_release(vllm_env):
        pytest.skip("vLLM's packed multi-group allocation exists on 0.24-0.28")
    r = harness(vllm_env[1], tmp_path, "swa_multi", "--family", "sliding-window", "--p-connector", "multi",
                env=dict({"ENABLE_XLKV": "true"}, **EQUAL_TP))
    _assert_bytes_exact(r, "sliding-window")
    assert r["num_regions"] == 1 and _groups_case(r)["xfer_descs_per_block"] == 1, (r["num_regions"],
                                                                                   _groups_case(r))
    assert "packed multi-group" not in json.dumps(r.get("warnings")), r.get("warnings")


def test_swa_flag_on_packs_the_groups_as_vllms_own_opt_in(vllm_env, runs):
    """0.24-0.28: with ENABLE_XLKV=true the sliding-window and full-attention
    groups share vLLM's packed multi-group allocation, registered as 1 NIXL region: as many
    descriptors per block id as vLLM's own opt-in (enable_cross_layers_blocks) registered, 1, where
    stock registers one per shared layer tensor; bytes exact in every group; D's compatibility hash
    tagged, so an unflagged peer is refused at the handshake."""
    if not _packed_release(vllm_env):
        pytest.skip("vLLM's packed multi-group allocation exists on 0.24-0.28")
    stock, xlkv = runs("sliding-window", "stock"), runs("sliding-window", "xlkv")
    _assert_bytes_exact(stock, "sliding-window")
    _assert_bytes_exact(xlkv, "sliding-window")
    assert len(xlkv["kv_cache_groups"]) >= 2, xlkv["kv_cache_groups"]
    reg_s, sent_s = _per_block(stock)
    reg_x, sent_x = _per_block(xlkv)
    assert reg_s == len(xlkv["kv_cache_groups"][0]["layers"]) > 1, (reg_s, stock["kv_cache_groups"])
    path = NATIVE_FIGURES.get(vllm_env[0])
    if path is not None:  # vLLM's own opt-in, measured once on this release
        runs_then = json.load(open(os.path.join(ROOT, path)))["runs"]  # a file of 2026-11-25: "swa"
        native = {canonical(k): v for k, v in runs_then.items()}["sliding-window"]["native"]
        assert native["native_opt_in"] is True and native["transfer_verified"] is True, native.get("errors")
        reg_n = native["registered"]["descs_per_block_id"]
        sent_n = native["cases"]["groups"]["xfer_descs_per_block"]
        assert (reg_x, sent_x) == (reg_n, sent_n), (reg_x, sent_x, reg_n, sent_n)
    assert reg_x == 1 and sent_x == 1, (reg_x, sent_x, xlkv["d"]["xlkv_log"][-4:])
    assert xlkv["registered"]["num_regions"] == 1, xlkv["registered"]
    log = "\n".join(xlkv["d"]["xlkv_log"])
    assert "packing" in log and "KV cache groups into one row per block id" in log, log[-1500:]
    assert "tagged as xlkv-cross-layer-KV-layout" in log, log[-1500:]
    # stock keeps one region per shared layer tensor, its hash untagged
    assert stock["registered"]["num_regions"] == reg_s, stock["registered"]


def test_shifted_block_of_one_group_is_caught(vllm_env, runs):
    """Planted fault: D's last KV cache group gets its first received block replaced by the
    next block (a descriptor shifted by one). The per-group byte check must name that group."""
    once_per_session(vllm_env, "the harness's own fault detection")
    r = runs("sliding-window", "xlkv", "--plant-fault", "shift-group")
    case = _groups_case(r)
    assert r["transfer_verified"] is False and case["bytes_ok"] is False, case
    assert case["recv_done"] is True, case
    *others, last = case["groups"]
    assert last["mismatches"] > 0 and all(g["mismatches"] == 0 for g in others), case["groups"]
