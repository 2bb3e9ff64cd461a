"""Model families (xlkv_autopatch.families): one decision per model, pure Python, no vLLM."""

from dataclasses import replace

import pytest

from xlkv_autopatch import facts as F
from xlkv_autopatch import families as FM

#: config.json fields of the real architectures (transformers configs), trimmed to what matters
DEEPSEEK_V3 = dict(model_type="deepseek_v3", num_hidden_layers=61, kv_lora_rank=512, qk_rope_head_dim=64)
DEEPSEEK_V32 = dict(DEEPSEEK_V3, model_type="deepseek_v32", index_topk=2048)
GPT_OSS = dict(model_type="gpt_oss", num_hidden_layers=36, sliding_window=128,
               layer_types=["sliding_attention", "full_attention"] * 18, num_key_value_heads=8)
GEMMA3_27B = dict(model_type="gemma3_text", num_hidden_layers=62, sliding_window=1024,
                  layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 10 + ["sliding_attention"] * 2)
GEMMA3_OLD = dict(model_type="gemma3_text", num_hidden_layers=12, sliding_window=512, sliding_window_pattern=6)
MISTRAL_ALL_SLIDING = dict(model_type="mistral", num_hidden_layers=32, sliding_window=4096)
QWEN3 = dict(model_type="qwen3", num_hidden_layers=28, num_key_value_heads=8)


def facts(cfg, *, use_mla=False, mamba=False, heads=2, pp=1, backends=()):
    return FM.classify(cfg, use_mla=use_mla, mamba=mamba, kv_heads_per_rank=heads, pp=pp, backends=backends)


def rel(layouts, *, packed=False, mla=()):
    """A release's facts (families.decide takes them whole): 0.29+ layouts, else 0.12-0.28 cross-layer
    blocks with or without the packed multi-group allocation and MLA backends."""
    return replace(F.facts_for("0.33.0" if layouts else "0.21.0"), packed_groups=packed, mla_cross_layer_backends=mla)


@pytest.mark.parametrize("cfg, kw, family", [
    (QWEN3, {}, FM.DENSE),
    (QWEN3, dict(heads=1), FM.ONE_KV_HEAD),
    (DEEPSEEK_V3, dict(use_mla=True, heads=1), FM.MLA),
    (DEEPSEEK_V32, dict(use_mla=True, heads=1), FM.SPARSE_MLA),
    (DEEPSEEK_V3, dict(use_mla=True, heads=1, backends=["FLASHMLA_SPARSE"]), FM.SPARSE_MLA),
    (GPT_OSS, {}, FM.SLIDING_WINDOW),
    (GEMMA3_27B, {}, FM.SLIDING_WINDOW),
    (GEMMA3_OLD, {}, FM.SLIDING_WINDOW),
    (MISTRAL_ALL_SLIDING, {}, FM.DENSE),  # every layer slides: one KV cache group
    (QWEN3, dict(mamba=True), FM.MAMBA_HYBRID),
    (DEEPSEEK_V3, dict(use_mla=True, mamba=True), FM.MAMBA_HYBRID),  # Kimi Linear: MLA + KDA
])
def test_family_from_config(cfg, kw, family):
    assert FM.family(facts(cfg, **kw)) == family


@pytest.mark.parametrize("family_facts, layouts, cross, words", [
    # vLLM 0.29+: block-outermost layouts
    (facts(QWEN3), True, True, "one whole-row region"),
    (facts(DEEPSEEK_V3, use_mla=True, heads=1), True, True, "packed latent row"),
    (facts(GPT_OSS), True, True, "1 descriptor per block id"),
    (facts(DEEPSEEK_V32, use_mla=True, heads=1), True, False, "#55431"),
    (facts(QWEN3, mamba=True), True, False, "Mamba"),
    (facts(QWEN3, heads=1), True, True, "each block's row as one region"),  # page_contiguous.py
    (facts(QWEN3, heads=1), True, True, "heterogeneous TP: 1 descriptor per block per remote rank"),
    (facts(GPT_OSS, heads=1), True, True, "one KV head per tensor-parallel rank: xlkv has vLLM register"),
    (facts(GPT_OSS, heads=1, pp=2), True, False, "pipeline parallel size 2"),
    (facts(QWEN3, heads=1, pp=2), True, False, "pipeline parallel size 2"),
    (facts(DEEPSEEK_V3, use_mla=True, heads=1, pp=2), True, False, "pipeline parallel size 2"),
    # vLLM 0.12-0.28: cross-layer blocks
    (facts(QWEN3), False, True, "cross-layer"),
    (facts(QWEN3, heads=1), False, True, "cross-layer"),  # one cross-layer tensor: 1 region whatever the heads
    (facts(DEEPSEEK_V3, use_mla=True, heads=1), False, False, "MLA"),
    # sliding-window hybrids, 0.12-0.23 (no packed allocation): stock with the family named, unless vLLM
    # planned one KV cache group (its hybrid KV cache manager off)
    (facts(GPT_OSS), False, False, "several KV cache groups"),
    (replace(facts(GPT_OSS), kv_cache_groups=2), False, False, "several KV cache groups"),
    (replace(facts(GEMMA3_27B), kv_cache_groups=7), False, False, "several KV cache groups"),
    (replace(facts(GPT_OSS), kv_cache_groups=1), False, True, "one cross-layer KV tensor"),
    (facts(DEEPSEEK_V32, use_mla=True, heads=1), False, False, "sparse indexer"),
])
def test_decide(family_facts, layouts, cross, words):
    d = FM.decide(family_facts, rel(layouts))
    assert d.cross_layer is cross
    assert words in d.reason
    assert d.reason.startswith(FM.TITLES[d.family])
    # 0.29+: heads outermost wherever heads are split over ranks, token-major rows for MLA; whole-row
    # registration at one KV head per rank whatever the family (a sliding-window hybrid too)
    want = None if not (layouts and cross) else "BLNHC" if family_facts.replicated else "BHLNC"
    assert d.layout == want
    assert d.whole_rows is bool(layouts and cross and not family_facts.replicated and family_facts.one_kv_head_per_rank)


@pytest.mark.parametrize("cfg, groups, cross, words", [
    # vLLM 0.24-0.28: the packed multi-group allocation (what enable_cross_layers_blocks turns on)
    (GPT_OSS, None, True, "packed multi-group"),
    (GPT_OSS, 2, True, "packed multi-group"),
    (GEMMA3_27B, 7, True, "packed multi-group"),
    (GPT_OSS, 1, True, "one cross-layer KV tensor"),  # hybrid KV cache manager off: the dense path
])
def test_sliding_window_hybrids_pack_their_groups_where_the_release_can(cfg, groups, cross, words):
    d = FM.decide(replace(facts(cfg), kv_cache_groups=groups), rel(False, packed=True), equal_tp=True)
    assert (d.family, d.cross_layer, d.for_any_tp) == (FM.SLIDING_WINDOW, cross, False)
    assert words in d.reason and d.reason.startswith(FM.TITLES[FM.SLIDING_WINDOW])
    # without XLKV_EQUAL_TP packed rows keep the stock layout (they cannot be sliced by KV heads), by design:
    # every TP pairing is served; one cross-layer tensor (one group, FLASH_ATTN decides in the patch) stays
    default = FM.decide(replace(facts(cfg), kv_cache_groups=groups), rel(False, packed=True))
    packed = words == "packed multi-group"
    assert (default.cross_layer, default.for_any_tp) == (not packed, packed)
    if packed:
        assert "XLKV_EQUAL_TP=true" in default.reason and "cannot be sliced by KV heads" in default.reason
    # the same model on a release without the packed allocation: stock with the family named (or the one tensor)
    before = FM.decide(replace(facts(cfg), kv_cache_groups=groups), rel(False))
    assert before.cross_layer is (groups == 1)
    assert before.reason.startswith(FM.TITLES[FM.SLIDING_WINDOW])


MLA_H100 = ("FLASH_ATTN_MLA", "TRITON_MLA")


def test_mla_gets_one_cross_layer_tensor_where_the_release_names_mla_backends():
    """0.26-0.28: MLA takes one cross-layer latent tensor on the MLA backends the
    release row names; sparse MLA, pipeline stages and releases without MLA backends keep stock."""
    mla = facts(DEEPSEEK_V3, use_mla=True, heads=1)
    d = FM.decide(mla, rel(False, mla=MLA_H100))
    assert (d.family, d.cross_layer) == (FM.MLA, True)
    assert "one cross-layer latent KV tensor" in d.reason and "TRITON_MLA" in d.reason
    assert FM.expected_descriptors(replace(mla, group_layers=61), d, kv_split_regions=False) == (61, 1)
    assert FM.decide(mla, rel(False)).cross_layer is False  # 0.12-0.25
    assert FM.decide(replace(mla, pp_size=2), rel(False, mla=MLA_H100)).cross_layer is False
    sparse = FM.decide(facts(DEEPSEEK_V32, use_mla=True, heads=1), rel(False, mla=MLA_H100))
    assert (sparse.family, sparse.cross_layer) == (FM.SPARSE_MLA, False)
    # the other families decide the same with or without MLA backends
    for other in (facts(QWEN3), facts(QWEN3, heads=1), facts(GPT_OSS), facts(QWEN3, mamba=True)):
        assert FM.decide(other, rel(False, mla=MLA_H100)) == \
            FM.decide(other, rel(False))


def test_packed_groups_change_only_sliding_window_hybrids():
    """The packed allocation is for several KV cache groups of attention layers: every other family
    decides the same with or without it."""
    for fam_facts in (facts(QWEN3), facts(QWEN3, heads=1), facts(DEEPSEEK_V3, use_mla=True, heads=1),
                      facts(DEEPSEEK_V32, use_mla=True, heads=1), facts(QWEN3, mamba=True)):
        for groups in (None, 1, 3):
            f = replace(fam_facts, kv_cache_groups=groups)
            assert FM.decide(f, rel(False, packed=True)) == \
                FM.decide(f, rel(False))


def test_expected_descriptors_of_packed_groups():
    # gpt-oss-120b on 0.26: 18 per block id stock (K/V in one page), 1 packed; 0.21: stock with the shim too
    g = facts(GPT_OSS)
    packed = FM.decide(g, rel(False, packed=True), equal_tp=True)
    assert FM.expected_descriptors(g, packed, kv_split_regions=False) == (18, 1)
    # without XLKV_EQUAL_TP: stock, so that any TP pairing is served
    assert FM.expected_descriptors(g, FM.decide(g, rel(False, packed=True)),
                                   kv_split_regions=False) == (18, 18)
    assert FM.expected_descriptors(g, FM.decide(g, rel(False)), kv_split_regions=True) == (36, 36)
    gemma = facts(GEMMA3_27B)
    assert FM.expected_descriptors(gemma, FM.decide(gemma, rel(False, packed=True), equal_tp=True),
                                   kv_split_regions=False) == (10, 1)


def test_every_family_has_a_title_and_a_decision():
    assert set(FM.TITLES) == set(FM.FAMILIES)
    for layouts, packed in ((False, False), (False, True), (True, False)):
        for fam_facts in (facts(QWEN3), facts(QWEN3, heads=1), facts(GPT_OSS), facts(DEEPSEEK_V3, use_mla=True),
                          facts(DEEPSEEK_V32, use_mla=True), facts(QWEN3, mamba=True)):
            d = FM.decide(fam_facts, rel(layouts, packed=packed))
            assert d.family in FM.FAMILIES and d.reason


def test_group_layers_and_expected_descriptors():
    # gpt-oss-120b: 18 sliding + 18 full layers, two groups of 18: 18 per block id stock, 1 with the shim
    g = facts(GPT_OSS)
    assert g.group_layers == 18
    d = FM.decide(g, rel(True))
    assert FM.expected_descriptors(g, d, kv_split_regions=False) == (18, 1)
    assert FM.expected_descriptors(g, d, kv_split_regions=True) == (36, 1)
    # Gemma-3-27B: 52 sliding + 10 full: groups of 10
    assert facts(GEMMA3_27B).group_layers == 10
    assert facts(GEMMA3_OLD).group_layers == 2
    # DeepSeek-V3: 61 latent caches per block, never split into K and V
    m = facts(DEEPSEEK_V3, use_mla=True, heads=1)
    assert FM.expected_descriptors(m, FM.decide(m, rel(True)), kv_split_regions=True) == (61, 1)
    assert FM.expected_descriptors(m, FM.decide(m, rel(False)), kv_split_regions=True) == (61, 61)
    # one KV head per rank on 0.29+: one region per row (page_contiguous.py), stock with pipeline stages
    o = facts(QWEN3, heads=1)
    assert FM.expected_descriptors(o, FM.decide(o, rel(True)), kv_split_regions=False) == (28, 1)
    o2 = facts(QWEN3, heads=1, pp=2)
    assert FM.expected_descriptors(o2, FM.decide(o2, rel(True)), kv_split_regions=False) == (28, 28)
    assert FM.expected_descriptors(FM.ModelShape(), FM.decide(FM.ModelShape(), rel(True)),
                                   kv_split_regions=False) == (None, 1)


def test_sliding_and_full():
    assert FM.sliding_and_full(("sliding_attention", "full_attention"), 128)
    assert not FM.sliding_and_full(("sliding_attention", "sliding_attention"), 128)  # all slide: one group
    assert not FM.sliding_and_full(("full_attention",), None)
    assert not FM.sliding_and_full((), 4096)


# ------------------------------------------------------------------ one vocabulary ------
LLAMA_70B = dict(model_type="llama", num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8)


def test_shape_is_independent_axes_and_the_family_is_derived_from_them():
    """A sliding-window hybrid at one KV head per rank (gpt-oss-120b's 8 KV heads at TP 8) keeps both facts:
    named sliding-window, decided with the one-head registration too."""
    g = FM.classify(GPT_OSS, tp=8)
    assert (g.attention, g.kv_heads, g.kv_heads_per_rank, g.mamba) == (FM.SLIDING_WINDOW, 8, 1, False)
    assert g.family == FM.family(g) == FM.SLIDING_WINDOW and g.one_kv_head_per_rank
    d = FM.decide(g, rel(True))
    assert d.whole_rows and "every KV cache group shares one whole-row region" in d.reason
    assert "one KV head per tensor-parallel rank" in d.reason
    # the same model at TP 1: the same family, no one-head registration
    g1 = FM.classify(GPT_OSS)
    assert g1.family == FM.SLIDING_WINDOW and not FM.decide(g1, rel(True)).whole_rows
    # full attention is named by its KV heads per rank; Mamba layers name the family whatever the attention
    assert [FM.classify(LLAMA_70B, tp=tp).family for tp in (1, 4, 8, 16)] == [FM.DENSE, FM.DENSE, FM.ONE_KV_HEAD,
                                                                              FM.ONE_KV_HEAD]
    kimi = FM.classify(DEEPSEEK_V3, mamba=True)
    assert (kimi.attention, kimi.mamba, kimi.family, kimi.replicated) == (FM.MLA, True, FM.MAMBA_HYBRID, True)
    assert FM.shape(FM.FULL, kv_heads=8, tp=8) == FM.ModelShape(attention=FM.FULL, kv_heads=8, kv_heads_per_rank=1)
    with pytest.raises(ValueError, match="attention kind"):
        FM.shape("sliding-hybrid")


@pytest.mark.parametrize("cfg, tp, attention, family, heads, per_rank", [
    (QWEN3, 1, FM.FULL, FM.DENSE, 8, 8),
    (LLAMA_70B, 8, FM.FULL, FM.ONE_KV_HEAD, 8, 1),
    (GPT_OSS, 8, FM.SLIDING_WINDOW, FM.SLIDING_WINDOW, 8, 1),
    (DEEPSEEK_V3, 8, FM.MLA, FM.MLA, 1, 1),  # no heads given: one latent cache, as vLLM 0.29+ counts it
    (dict(DEEPSEEK_V3, num_key_value_heads=128), 8, FM.MLA, FM.MLA, 128, 16),  # as the config (or vLLM) counts
    (DEEPSEEK_V32, 1, FM.SPARSE_MLA, FM.SPARSE_MLA, 1, 1),
    (dict(model_type="qwen3_next", num_key_value_heads=2), 1, FM.FULL, FM.MAMBA_HYBRID, 2, 2),
    (dict(model_type="x", layer_types=["full_attention", "linear_attention"], num_key_value_heads=4), 2, FM.FULL,
     FM.MAMBA_HYBRID, 4, 2),
    (MISTRAL_ALL_SLIDING, 1, FM.FULL, FM.DENSE, None, None),  # every layer slides: one KV cache group
    # a multimodal wrapper's language model; Gemma configs written without layer_types or their pattern
    (dict(model_type="gemma3", text_config=dict(GEMMA3_27B, num_key_value_heads=16)), 2, FM.SLIDING_WINDOW,
     FM.SLIDING_WINDOW, 16, 8),
    (dict(model_type="gemma3", text_config=dict(sliding_window=512, num_hidden_layers=12)), 1, FM.SLIDING_WINDOW,
     FM.SLIDING_WINDOW, None, None),
    (dict(model_type="gemma2", sliding_window=4096, num_hidden_layers=42, num_key_value_heads=8), 1,
     FM.SLIDING_WINDOW, FM.SLIDING_WINDOW, 8, 8),
])
def test_classify_a_config_dict_at_a_tp_size(cfg, tp, attention, family, heads, per_rank):
    s = FM.classify(cfg, tp=tp)
    assert (s.attention, s.family, s.kv_heads, s.kv_heads_per_rank) == (attention, family, heads, per_rank)


def test_the_interleaved_gemma_configs_count_their_groups():
    assert FM.classify(dict(model_type="gemma2", sliding_window=4096, num_hidden_layers=42)).group_layers == 21
    assert FM.classify(dict(model_type="gemma3_text", sliding_window=512, num_hidden_layers=12)).group_layers == 2


def test_one_set_of_names_and_the_old_spellings_in_one_place():
    assert FM.canonical("sliding-hybrid") == FM.canonical("swa") == FM.SLIDING_WINDOW
    assert FM.canonical("mqa") == FM.ONE_KV_HEAD
    assert all(FM.canonical(name) == name for name in FM.FAMILIES)
    assert set(FM.ALIASES.values()) <= set(FM.FAMILIES) and not set(FM.ALIASES) & set(FM.FAMILIES)
    assert set(FM.ATTENTION_KINDS) - {FM.FULL} <= set(FM.FAMILIES)


@pytest.mark.parametrize("release, backend, equal_tp, kept", [
    ("0.26.0", "FLASH_ATTN", False, False),   # heads outermost: any TP pairing is sliced
    ("0.26.0", "FLASHINFER", False, True),    # blocks-first
    ("0.26.0", "FLASHINFER", True, False),    # XLKV_EQUAL_TP: every peer at this TP size
    ("0.24.0", "FLASH_ATTN", False, True),    # 0.23-0.25: FLASH_ATTN's block is blocks-first too
    ("0.21.0", "TRITON_ATTN", False, True),
])
def test_backends_whose_blocks_cannot_be_sliced_by_heads_keep_stock_for_any_tp(release, backend, equal_tp, kept):
    why = FM.kept_stock_for_any_tp(backend, F.facts_for(release), equal_tp=equal_tp)
    assert (why is not None) is kept
    if kept:
        assert why.startswith("every prefill/decode pair of tensor-parallel sizes is served this way")
        assert backend in why and "XLKV_EQUAL_TP=true" in why


def test_the_run_time_preference_asks_the_same_function_as_status(monkeypatch):
    """patches/cross_layer_preference.py's step and model_report's are one function (a planted answer shows
    at run time; tests/unit/test_status_model.py plants it for status)."""
    from xlkv_autopatch.patches import cross_layer_preference

    seen = []
    monkeypatch.setattr(FM, "kept_stock_for_any_tp", lambda backend, release, equal_tp: seen.append(backend) or "X")
    assert cross_layer_preference._unsliceable("FLASHINFER") == "X" and seen == ["FLASHINFER"]


def test_cross_layer_regions_per_block():
    from xlkv_autopatch import layout

    assert layout.cross_layer_regions(backend="FLASH_ATTN") == 1
    # 0.23-0.25: FLASH_ATTN's cross-layer block has K/V outside the heads but inside the block: 1 region
    # (experiments/results/compat-matrix.json, 0.23.0: xlkv num_regions 1)
    assert layout.cross_layer_regions(backend="FLASH_ATTN") == 1
    assert layout.cross_layer_regions(backend="FLASHINFER") == 2
    # a blocks-first block is one region where the release keeps K and V together (0.26+; the CPU harness
    # with TRITON_ATTN and XLKV_EQUAL_TP=true: 2 regions per block on 0.21.0, 1 on 0.26.0)
    assert layout.cross_layer_regions(backend="TRITON_ATTN", kv_split_regions=True) == 2
    assert layout.cross_layer_regions(backend="TRITON_ATTN", kv_split_regions=False) == 1
    assert layout.cross_layer_regions(backend="FLASHINFER", whole_rows=True) == 1
    assert layout.cross_layer_regions(backend="TRITON_MLA", replicated=True) == 1


def test_engine_shape_counts_heads_per_rank_at_the_engines_tp_when_vllm_cannot_say():
    """patches/_model.model_shape: where vLLM's own get_num_kv_heads fails, the heads per rank come from the
    config at the engine's TP size (a Llama-70B-like 8-head model at TP 8: one per rank), not at TP 1."""
    from types import SimpleNamespace

    from xlkv_autopatch.patches import _model

    def broken(parallel):
        raise RuntimeError("no")

    hf = SimpleNamespace(model_type="llama", num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                         head_dim=128, hidden_size=8192)
    cfg = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=hf, use_mla=False, is_hybrid=False,
                                                       get_num_kv_heads=broken),
                          parallel_config=SimpleNamespace(tensor_parallel_size=8, pipeline_parallel_size=1))
    shape = _model.model_shape(cfg, backends=())
    assert shape.kv_heads_per_rank == 1 and shape.one_kv_head_per_rank
