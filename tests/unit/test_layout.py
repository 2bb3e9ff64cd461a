"""Pure layout arithmetic and decisions (xlkv_autopatch.layout): no vLLM, no torch."""

import pytest

from xlkv_autopatch import facts as F
from xlkv_autopatch import layout as L
from xlkv_autopatch.releases import BACKENDS


def decide(**kw):
    base = dict(backend="FLASH_ATTN", kv_layout="HND", allowed_backends=BACKENDS["fa+fi+triton"])
    base.update(kw)
    return L.cross_layer_decision(**base)


def test_cross_layer_decision_accepts_the_supported_case():
    d = decide()
    assert d.use and "FLASH_ATTN" in d.reason


@pytest.mark.parametrize("kw, reason", [
    (dict(has_mamba=True), "Mamba"),
    (dict(num_kv_groups=2), "2 KV cache groups"),
    (dict(backend="CPU_ATTN"), "CPU_ATTN is not in"),
    (dict(backend="TRITON_ATTN", allowed_backends=BACKENDS["fa+fi"]), "TRITON_ATTN is not in"),
    (dict(kv_layout="NHD"), "NHD"),
    (dict(host_buffer=True), "host-buffer"),
    (dict(explicit_opt_in="False"), "enable_cross_layers_blocks=False"),
])
def test_cross_layer_decision_refusals_name_the_reason(kw, reason):
    d = decide(**kw)
    assert not d.use and reason in d.reason


def test_explicit_opt_in_true_is_fine():
    assert decide(explicit_opt_in="True").use


def test_release_facts():
    assert "TRITON_ATTN" not in F.facts_for((0, 19, 1)).cross_layer_backends
    assert "TRITON_ATTN" in F.facts_for((0, 20, 0)).cross_layer_backends
    assert not F.facts_for("0.12.0").has_compat_hash and F.facts_for("0.13.0").has_compat_hash
    assert not F.facts_for("0.17.1").budget_block_count and F.facts_for("0.18.1").budget_block_count
    assert [F.facts_for("0.%d.0" % m).fa_heads_outermost for m in (12, 22, 23, 25, 26, 28, 29, 33)] == \
        [True, True, False, False, True, True, False, False]
    assert F.facts_for("0.28.0").mechanism != "layout" and F.facts_for("0.29.0").mechanism == "layout"
    # a development build of 0.29 (setuptools-scm: main after the 0.28 tag) is 0.28 code
    assert F.facts_for("0.29.0.dev12+g1234").mechanism != "layout"
    assert F.facts_for("0.29.1.dev3").mechanism == "layout"
    assert F.facts_for("0.21.0+cu129") == F.facts_for("0.21.0")


def test_layout_decision():
    assert L.layout_decision(stock="LBHNC", env_layout=None).use
    assert L.layout_decision(stock=None, env_layout=None).use  # MLA: NixlConnector asks for nothing
    d = L.layout_decision(stock="LBHNC", env_layout="LBNHC")
    assert not d.use and "VLLM_KV_CACHE_LAYOUT=LBNHC" in d.reason
    assert L.BLOCK_OUTERMOST_LAYOUT in L.WHOLE_ROW_LAYOUTS


def test_infer_kernel_block_size():
    # Qwen3-0.6B: 28 layers, 8 KV heads, head 128, K+V; 100 blocks of 16 tokens
    numel = 100 * 16 * 28 * 8 * 128 * 2
    assert L.infer_kernel_block_size(numel, 100, 28, 8, 128) == 16
    # kernel block 16 under logical 32: twice the blocks, same elements
    assert L.infer_kernel_block_size(numel, 200, 28, 8, 128) == 8
    with pytest.raises(ValueError):
        L.infer_kernel_block_size(numel + 1, 100, 28, 8, 128)
    with pytest.raises(ValueError):
        L.infer_kernel_block_size(numel, 0, 28, 8, 128)


def test_registration_view_shape_keeps_elements_blocks_and_block_size_position():
    numel = 40 * 2 * 4 * 2 * 16 * 64
    for pos in (-3, -2):
        shape = L.registration_view_shape(numel, 40, 16, pos)
        prod = 1
        for d in shape:
            prod *= d
        assert prod == numel and shape[0] == 40 and shape[pos] == 16 and len(shape) == 4
    with pytest.raises(ValueError):
        L.registration_view_shape(numel, 40, 16, -1)
    with pytest.raises(ValueError):
        L.registration_view_shape(numel, 41, 16, -3)


def test_reconcile_block_counts():
    assert L.reconcile_block_counts({"a": 64, "b": 64}, 64) == (64, None)
    real, note = L.reconcile_block_counts({"a": 96, "b": 96}, 64)
    assert real == 96 and "budget is 64" in note
    with pytest.raises(ValueError, match="disagree"):
        L.reconcile_block_counts({"a": 64, "b": 65}, 64)
    with pytest.raises(ValueError, match="hold 32 blocks but the worker indexes 64"):
        L.reconcile_block_counts({"a": 32}, 64)
    with pytest.raises(ValueError):
        L.reconcile_block_counts({}, 64)


def test_tag_hash_is_deterministic_and_distinct():
    h = "ab" * 32
    assert L.tag_hash(h) == L.tag_hash(h) != h
    assert L.tag_hash(h) != L.tag_hash("cd" * 32)
    assert L.tag_hash(h).startswith(L.HASH_PREFIX) and "ENABLE_XLKV=true" in L.tag_hash(h)
    assert len(L.tag_hash(h)) == len(L.HASH_PREFIX) + 64


def test_the_row_registration_has_its_own_tag_and_the_stock_tag_is_unchanged():
    h = "ab" * 32
    row = L.tag_hash(h, L.ROW_AT_ONE_KV_HEAD)
    assert row.startswith(L.HASH_PREFIX) and row not in (L.tag_hash(h), h)
    assert row == L.tag_hash(h, L.ROW_AT_ONE_KV_HEAD) != L.tag_hash("cd" * 32, L.ROW_AT_ONE_KV_HEAD)
    # the plain tag is what earlier versions published (peers of another xlkv version interoperate)
    import hashlib
    assert L.tag_hash(h) == L.HASH_PREFIX + hashlib.sha256(("%s|%s" % (h, L.HASH_TAG)).encode()).hexdigest()


@pytest.mark.parametrize("offsets, page, row, why", [
    ([0, 512, 1024, 1536], 512, 2048, None),
    ([1536, 0, 1024, 512], 512, 2048, None),  # any order
    ([0, 0, 512, 512], 512, 1024, None),  # two layers sharing a page
    ([0, 512, 1024], 512, 2048, "not at every multiple"),  # a gap: padding or another cache in the row
    ([0, 512, 1024, 1536], 512, 2560, "not at every multiple"),
    ([0, 256, 512, 768], 512, 2048, "not at every multiple"),  # overlapping pages
    ([0, 512], 512, 1000, "not a whole number"),
    ([0], 0, 512, "a page of 0 bytes"),
])
def test_row_tiling(offsets, page, row, why):
    got = L.row_tiling(offsets, page, row)
    assert got is None if why is None else why in got


def test_column_major_page_strides_walk_the_same_page_bytes_out_of_order():
    # a [blocks, 1 head, 16 tokens, 128] view in a row of 4 such pages (BLNHC at one KV head per rank)
    shape, strides = (40, 1, 16, 128), (4 * 16 * 128, 128, 128, 1)
    new = L.column_major_page_strides(shape, strides)
    assert new[0] == strides[0]  # the block stride vLLM reads is kept
    page = sorted(n * new[2] + c * new[3] for n in range(16) for c in range(128))
    assert page == list(range(16 * 128))  # every element of the page exactly once: the same bytes
    assert (new[2], new[3]) != (128, 1)  # ... but not in row-major order: the page is not contiguous
    for bad_shape, bad_strides in [((40, 2, 16, 128), strides), ((40, 1, 1, 128), strides),
                                   ((40, 1, 16, 128), (8192, 128, 256, 1)), ((16, 128), (128, 1))]:
        with pytest.raises(ValueError):
            L.column_major_page_strides(bad_shape, bad_strides)


def test_heterogeneous_tp():
    assert L.heterogeneous_tp_supported(cross_layer=True, blocks_first=False, tp_ratio=2).use
    assert L.heterogeneous_tp_supported(cross_layer=True, blocks_first=True, tp_ratio=1).use
    assert not L.heterogeneous_tp_supported(cross_layer=True, blocks_first=True, tp_ratio=2).use
    assert not L.heterogeneous_tp_supported(cross_layer=True, blocks_first=False, tp_ratio=-2,
                                            whole_row_layout=True).use
    assert L.heterogeneous_tp_supported(cross_layer=False, blocks_first=True, tp_ratio=2).use


# --- descriptor order (patches/transfer_order.py) ----------------------------------------

def _apply(order, ids):
    return [ids[i] for i in order]


@pytest.mark.parametrize("local, remote, before, after", [
    (list(range(19, 11, -1)), list(range(39, 31, -1)), 8, 1),      # both sides descending
    ([14, 20, 15, 21, 16, 22], [8, 24, 9, 25, 10, 26], 6, 2),       # two interleaved runs
    ([5, 4, 3], [10, 11, 12], 3, 3),                                # opposite directions: no order helps
    ([3, 9, 1, 7], [30, 2, 17, 40], 4, 4),                          # nothing contiguous
])
def test_ascending_order_merges_runs_contiguous_on_both_sides(local, remote, before, after):
    assert L.merged_descriptor_count(local, remote) == before
    order = L.ascending_order(local)
    assert sorted(order) == list(range(len(local)))
    l2, r2 = _apply(order, local), _apply(order, remote)
    assert l2 == sorted(local)
    assert sorted(zip(l2, r2)) == sorted(zip(local, remote))  # the same pairs, nothing else
    assert L.merged_descriptor_count(l2, r2) == after


def test_ascending_order_leaves_ordered_lists_alone_and_is_stable():
    assert L.ascending_order([1, 2, 2, 5]) is None
    assert L.ascending_order([]) is None
    assert L.ascending_order([4]) is None
    assert list(L.ascending_order([3, 1, 3, 1])) == [1, 3, 0, 2]


def test_ascending_order_of_a_numpy_array_matches_the_list_rule():
    np = pytest.importorskip("numpy")
    ids = np.array([9, 4, 4, 1, 7], dtype=np.int32)
    assert list(L.ascending_order(ids)) == list(L.ascending_order(ids.tolist())) == [3, 1, 2, 4, 0]
    assert L.ascending_order(np.arange(5)) is None


def test_merged_descriptor_count_needs_pairs():
    with pytest.raises(ValueError):
        L.merged_descriptor_count([1, 2], [1])


def test_remote_layout_comparison():
    # <= 0.28: region counts (cross-layer 1, stock one per layer)
    assert L.remote_cross_layer(local_cross=True, local_regions=1, remote_regions=1) is None
    assert L.remote_cross_layer(local_cross=True, local_regions=1, remote_regions=8) is False
    assert L.remote_cross_layer(local_cross=False, local_regions=8, remote_regions=1) is True
    assert L.remote_cross_layer(local_cross=False, local_regions=8, remote_regions=8) is None
    # 0.29+: layout names, whatever the counts (one head per rank: BLNHC has one region per layer)
    kw = dict(local_cross=False, local_regions=4, remote_regions=4)
    assert L.remote_cross_layer(local_layout="LBHNC", remote_layout="BLNHC", **kw) is True
    assert L.remote_cross_layer(local_layout="BLNHC", remote_layout="LBHNC", **kw) is False
    assert L.remote_cross_layer(local_layout="LBHNC", remote_layout="LBNHC", **kw) is None
    assert L.remote_cross_layer(local_layout="BLNHC", remote_layout="BHLNC", **kw) is None


def test_explicit_layout_variable_is_named():
    base = dict(backend="FLASH_ATTN", allowed_backends=("FLASH_ATTN",))
    d = L.cross_layer_decision(kv_layout="NHD", env_layout="NHD", **base)
    assert not d.use and "VLLM_KV_CACHE_LAYOUT=NHD is set explicitly" in d.reason
    d = L.cross_layer_decision(kv_layout="NHD", env_layout=None, **base)
    assert not d.use and "VLLM_KV_CACHE_LAYOUT" not in d.reason
    assert L.cross_layer_decision(kv_layout="HND", env_layout="HND", **base).use


def test_explicit_layout_0_29():
    """An explicit VLLM_KV_CACHE_LAYOUT decides on 0.29+ (vLLM never asks the connector)."""
    assert L.explicit_layout(None) is None and L.explicit_layout(" ") is None
    stock = L.explicit_layout("LBHNC")
    assert not stock.use and "VLLM_KV_CACHE_LAYOUT=LBHNC is set explicitly and wins" in stock.reason
    assert "this engine runs LBHNC, one NIXL region per layer" in stock.reason
    assert "this engine runs LBNHC" in L.explicit_layout("NHD").reason  # vLLM's alias
    assert L.explicit_layout("BHLNC").use and L.explicit_layout("bhlnc").use
    blnhc = L.explicit_layout("BLNHC")
    assert blnhc.use and "heterogeneous TP is refused" in blnhc.reason


def test_heterogeneous_tp_0_29():
    """Heads-outermost rows are sliceable, token-major ones are not; MLA is replicated."""
    kw = dict(cross_layer=True, blocks_first=False, whole_row_layout=True)
    assert L.heterogeneous_tp_supported(tp_ratio=2, heads_outermost_rows=True, **kw).use
    assert L.heterogeneous_tp_supported(tp_ratio=-4, heads_outermost_rows=True, **kw).use
    assert not L.heterogeneous_tp_supported(tp_ratio=2, **kw).use
    assert "token-major" in L.heterogeneous_tp_supported(tp_ratio=2, **kw).reason
    assert L.heterogeneous_tp_supported(tp_ratio=2, replicated=True, **kw).use


def test_heads_tile_row():
    # 4 layers, one head's page 2048 bytes: 2 heads per row of 16384 bytes, heads 8192 apart
    offsets = [0, 2048, 4096, 6144]
    assert L.heads_tile_row(heads=2, head_stride=8192, page_offsets=offsets, page_bytes=4096, row_bytes=16384) is None
    assert L.heads_tile_row(heads=1, head_stride=0, page_offsets=offsets, page_bytes=2048, row_bytes=8192) is None
    # KV cache groups aliasing one row: repeated offsets count once
    assert L.heads_tile_row(heads=2, head_stride=8192, page_offsets=offsets * 3, page_bytes=4096,
                            row_bytes=16384) is None
    # padding after the heads (the row is longer than heads x layers x page)
    assert "padded" in L.heads_tile_row(heads=2, head_stride=8192, page_offsets=offsets, page_bytes=4096,
                                        row_bytes=16384 + 512)
    # a group with fewer layers than the row holds (3 of 4 page slots used)
    assert "byte offsets" in L.heads_tile_row(heads=2, head_stride=8192, page_offsets=offsets[:3], page_bytes=4096,
                                              row_bytes=16384)
    assert L.heads_tile_row(heads=3, head_stride=1, page_offsets=[0], page_bytes=4096, row_bytes=4096)


def test_remote_sources():
    assert L.remote_sources(prefill_tp=1, decode_tp=4, kv_heads=8) == (1, None)
    assert L.remote_sources(prefill_tp=4, decode_tp=1, kv_heads=8) == (4, None)
    assert L.remote_sources(prefill_tp=8, decode_tp=2, kv_heads=8) == (4, None)
    assert L.remote_sources(prefill_tp=16, decode_tp=2, kv_heads=8)[0] is None  # vLLM refuses (stock too)
    assert L.remote_sources(prefill_tp=16, decode_tp=2, kv_heads=8, replicated=True) == (1, None)  # MLA
    assert "do not divide" in L.remote_sources(prefill_tp=3, decode_tp=2, kv_heads=8)[1]


def test_one_function_answers_whether_a_tp_pairing_is_served():
    """The NIXL handshake (patches/handshake.py) and status (model_report.pair, status_report.runtime_refusals)
    ask layout.pair_served, and nothing else in the package asks heterogeneous_tp_supported: two roads for
    one decision agreed only by luck of the arithmetic (status once passed a fixed tp_ratio of 2)."""
    import ast
    import os
    import xlkv_autopatch
    root = os.path.dirname(xlkv_autopatch.__file__)
    callers, askers = set(), set()
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            tree = ast.parse(open(path, encoding="utf-8").read())
            for fn in ast.walk(tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Call):
                        called = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                        if called == "heterogeneous_tp_supported":
                            callers.add((rel, fn.name))
                        if called == "pair_served":
                            askers.add(rel)
    assert callers == {("layout.py", "pair_served")}, callers
    assert {os.path.join("patches", "handshake.py"), "model_report.py", "status_report.py"} <= askers, askers


@pytest.mark.parametrize("release", ["0.14.1", "0.21.0", "0.23.0", "0.26.0", "0.29.0", "0.33.0"])
@pytest.mark.parametrize("local_tp,remote_tp", [(2, 1), (1, 2), (4, 1), (1, 4), (2, 2)])
def test_pair_served_per_release(release, local_tp, remote_tp):
    from xlkv_autopatch import facts
    f = facts.facts_for(release)
    equal = local_tp == remote_tp
    # MLA's replicated latent cache is served at any pairing; equal sizes always
    assert L.pair_served(f, local_tp=local_tp, remote_tp=remote_tp, replicated=True).use
    rows = L.pair_served(f, local_tp=local_tp, remote_tp=remote_tp, heads_outermost_rows=True)
    fa = L.pair_served(f, local_tp=local_tp, remote_tp=remote_tp, backend="FLASH_ATTN")
    triton = L.pair_served(f, local_tp=local_tp, remote_tp=remote_tp, backend="TRITON_ATTN")
    packed = L.pair_served(f, local_tp=local_tp, remote_tp=remote_tp, packed_groups=True)
    if equal:
        assert rows.use and fa.use and triton.use and packed.use
    elif f.mechanism == "layout":
        assert rows.use and not L.pair_served(f, local_tp=local_tp, remote_tp=remote_tp).use   # BLNHC rows
    else:
        assert fa.use == f.fa_heads_outermost and not triton.use and not packed.use
