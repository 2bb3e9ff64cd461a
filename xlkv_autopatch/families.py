"""Model families: what the shim does for a model, decided in one place (pure Python, no vLLM).

Every patch that treats models differently asks :func:`decide` with the facts the vLLM glue
gathered (:mod:`xlkv_autopatch.patches._model`), and ``python -m xlkv_autopatch status
--model DIR`` asks the same function with facts read from a Hugging Face config folder, so
what status predicts is what the engine does.

A family is a shape of KV cache, not a model name:

========================  ==================================================================
``dense``                 full attention, one KV cache group, two or more KV heads per rank
``one-kv-head``           full attention with one KV head per tensor-parallel rank (MQA, or
                          as many KV heads as the TP size: Llama-3.1-70B at TP 8)
``sliding-window``        sliding-window + full attention layers: several KV cache groups
                          (gpt-oss, Gemma 3)
``mla``                   multi-head latent attention: one latent cache per layer, no K/V
                          split (DeepSeek-V2/V3/R1, Kimi K2)
``sparse-mla``            MLA with a sparse (DSA) indexer cache (DeepSeek-V3.2, GLM-5)
``mamba-hybrid``          Mamba / linear-attention layers beside attention (Qwen3-Next,
                          Nemotron-H, Jamba, Kimi Linear)
========================  ==================================================================
"""

from dataclasses import dataclass, field
from typing import Optional, Tuple

from .layout import BLOCK_OUTERMOST_LAYOUT, HEADS_OUTERMOST_LAYOUT, kept_for_any_tp

DENSE = "dense"
ONE_KV_HEAD = "one-kv-head"
SLIDING_WINDOW = "sliding-window"
MLA = "mla"
SPARSE_MLA = "sparse-mla"
MAMBA_HYBRID = "mamba-hybrid"
FAMILIES = (DENSE, ONE_KV_HEAD, SLIDING_WINDOW, MLA, SPARSE_MLA, MAMBA_HYBRID)

#: what each family is called in messages (with examples an operator recognises)
TITLES = {
    DENSE: "dense attention",
    ONE_KV_HEAD: "one KV head per tensor-parallel rank (MQA, or KV heads = TP size)",
    SLIDING_WINDOW: "sliding-window + full attention hybrid (gpt-oss, Gemma 3 style)",
    MLA: "MLA (DeepSeek-V2/V3, Kimi K2 style)",
    SPARSE_MLA: "MLA with a sparse indexer (DeepSeek-V3.2, GLM-5 style)",
    MAMBA_HYBRID: "Mamba / linear-attention hybrid (Qwen3-Next, Nemotron-H style)",
}

#: ``layer_types`` spellings of a sliding-window attention layer (transformers configs)
SLIDING_LAYER_TYPES = ("sliding_attention", "sliding_window_attention", "local_attention")
#: ``layer_types`` spellings of a sparse-indexer attention layer
SPARSE_LAYER_TYPES = ("indexed_attention", "deepseek_sparse_attention", "qwen_sparse_attention")
#: attention backend names that mark a sparse-indexer MLA model
SPARSE_BACKEND_MARKS = ("SPARSE", "INDEXER")


@dataclass(frozen=True)
class ModelFacts:
    """What the decision needs to know about a model on one engine."""

    use_mla: bool = False
    sparse_indexer: bool = False
    mamba: bool = False
    sliding_window: bool = False
    kv_heads_per_rank: Optional[int] = None
    pp_size: int = 1
    #: attention layers that one KV cache group's block id spans, where known (all attention
    #: layers with one group; with sliding-window + full layers vLLM groups them in equal
    #: groups of about the smaller layer-type count): for expected descriptor counts
    group_layers: Optional[int] = None
    #: KV cache groups vLLM planned for the engine, where known (the KV cache config exists only
    #: once the engine planned it; None for ``status --model`` and the model-runner choice)
    kv_cache_groups: Optional[int] = None
    #: where the facts came from (engine config, config.json), for messages
    source: str = field(default="engine", compare=False)


def family(facts: ModelFacts) -> str:
    if facts.mamba:
        return MAMBA_HYBRID
    if facts.use_mla:
        return SPARSE_MLA if facts.sparse_indexer else MLA
    if facts.sliding_window:
        return SLIDING_WINDOW
    if facts.kv_heads_per_rank == 1:
        return ONE_KV_HEAD
    return DENSE


@dataclass(frozen=True)
class ModelDecision:
    family: str
    #: the shim lays out (0.12-0.28) or requests (0.29+) the cross-layer / block-outermost layout
    cross_layer: bool
    reason: str
    #: 0.29+: the KV-cache layout requested (layout.HEADS_OUTERMOST_LAYOUT where KV heads are split over
    #: tensor-parallel ranks, layout.BLOCK_OUTERMOST_LAYOUT for MLA); None elsewhere and for the stock layout
    layout: Optional[str] = None
    #: 0.29+: xlkv has vLLM register each block's row as one region although a layer's page is
    #: contiguous on its own (one KV head per tensor-parallel rank: patches/page_contiguous.py)
    whole_rows: bool = False
    #: the stock layout is kept by design, so that every prefill/decode TP pairing is served
    #: (layout.kept_for_any_tp; XLKV_EQUAL_TP=true would take the cross-layer layout): an INFO line
    for_any_tp: bool = False

    @property
    def title(self) -> str:
        return TITLES[self.family]


def decide(facts: ModelFacts, *, block_outermost_layouts: bool, packed_groups: bool = False,
           mla_backends: Tuple[str, ...] = (), equal_tp: bool = False) -> ModelDecision:
    """What the shim does for this model.

    ``block_outermost_layouts``: the release chooses KV-cache layouts once per engine (vLLM
    0.29+, the ``layout`` mechanism); otherwise the shim lays out cross-layer blocks
    (0.12-0.28).  ``packed_groups``: the release has vLLM's packed multi-group KV allocation
    (0.24-0.28), which the shim turns on for sliding-window hybrids where every peer runs this
    engine's TP size (``equal_tp``: XLKV_EQUAL_TP; packed rows cannot be sliced by KV heads, so
    without it they keep the stock layout and any TP pairing is served).  ``mla_backends``: the MLA
    attention backends whose cross-layer blocks xlkv turns on on this release (0.26-0.28; the
    patch checks the engine's backend against them).  Only the model's shape
    is decided here; the attention backend, host-buffer mode, the kernel block and the user's
    explicit settings are checked by the patches.
    """
    fam = family(facts)
    title = TITLES[fam]
    if fam == MAMBA_HYBRID:
        return ModelDecision(fam, False, "%s: keeps the stock layout (Mamba state pages and attention pages do not "
                                         "share one row layout that vLLM's NIXL code is proven on)" % title)
    if fam == SPARSE_MLA:
        return ModelDecision(fam, False, "%s: keeps the stock layout (vLLM's sparse indexer kernels assume compact "
                                         "per-layer rows under block-outermost layouts: vLLM issues #55431, #55528)"
                             % title)
    if not block_outermost_layouts:
        if fam == MLA and mla_backends:
            if facts.pp_size > 1:
                return ModelDecision(fam, False, "%s with pipeline parallel size %d: keeps the stock layout (xlkv's "
                                                 "MLA cross-layer blocks are not proven with pipeline stages)"
                                     % (title, facts.pp_size))
            return ModelDecision(fam, True, "%s: one cross-layer latent KV tensor, 1 descriptor per block, on the MLA "
                                            "backends run with it on a GPU (%s; vLLM's own NIXL opt-in has no MLA backend "
                                            "here)" % (title, ", ".join(mla_backends)))
        if fam == MLA:
            return ModelDecision(fam, False, "%s: keeps the stock layout on this vLLM (cross-layer blocks here are "
                                             "allocated for FlashAttention-style K/V layers only)" % title)
        if fam == SLIDING_WINDOW:
            return _sliding_window_before_layouts(facts, title, packed_groups, equal_tp)
        return ModelDecision(fam, True, "%s: one cross-layer KV tensor, 1 descriptor per block" % title)
    # vLLM >= 0.29: a block-outermost layout; what vLLM registers decides the gain
    if fam == MLA:
        if facts.pp_size > 1:
            return ModelDecision(fam, False, "%s with pipeline parallel size %d: keeps the stock layout (vLLM "
                                             "registers per-layer pages of a packed MLA row when pipeline stages "
                                             "route layers; not proven here)" % (title, facts.pp_size))
        return ModelDecision(fam, True, "%s: block-outermost %s, vLLM registers each block's packed latent row as "
                                        "one region: 1 descriptor per block (the latent cache is replicated on "
                                        "every tensor-parallel rank: any prefill/decode TP pairing reads one rank)"
                             % (title, BLOCK_OUTERMOST_LAYOUT), layout=BLOCK_OUTERMOST_LAYOUT)
    one_head = facts.kv_heads_per_rank == 1
    if one_head and facts.pp_size > 1:
        return ModelDecision(fam, False, "%s, one KV head per tensor-parallel rank, pipeline parallel size %d: keeps "
                                         "the stock layout (vLLM registers a block-outermost layout as one NIXL region "
                                         "per layer when a layer's page is contiguous, and xlkv registers the row as "
                                         "one region only without pipeline stages)" % (title, facts.pp_size))
    what = {SLIDING_WINDOW: "every KV cache group shares one whole-row region: 1 descriptor per block id "
                            "(sliding-window groups send their in-window blocks only)",
            ONE_KV_HEAD: "xlkv has vLLM register each block's row as one region (vLLM alone registers a "
                         "contiguous page per layer at one KV head per rank): 1 descriptor per block"}.get(
        fam, "one whole-row region: 1 descriptor per block")
    if one_head and fam != ONE_KV_HEAD:
        what += "; one KV head per tensor-parallel rank: xlkv has vLLM register each row as one region"
    return ModelDecision(fam, True, "%s: block-outermost %s with the KV heads outermost in each block row, %s; "
                                    "heterogeneous TP: 1 descriptor per block per remote rank (a remote rank's "
                                    "heads are one range of the row)" % (title, HEADS_OUTERMOST_LAYOUT, what),
                         layout=HEADS_OUTERMOST_LAYOUT, whole_rows=one_head)


def _sliding_window_before_layouts(facts: ModelFacts, title: str, packed_groups: bool,
                                   equal_tp: bool) -> ModelDecision:
    """vLLM 0.12-0.28, sliding-window + full attention: one cross-layer KV tensor where vLLM planned
    one KV cache group (its hybrid KV cache manager off), vLLM's packed multi-group allocation
    where the release has it (0.24-0.28) and every peer runs this TP size, else the stock layout."""
    if facts.kv_cache_groups == 1:
        return ModelDecision(SLIDING_WINDOW, True, "%s with one KV cache group (vLLM's hybrid KV cache manager is "
                                                   "off): one cross-layer KV tensor, 1 descriptor per block" % title)
    if packed_groups and not equal_tp:
        return ModelDecision(SLIDING_WINDOW, False, "%s with several KV cache groups: keeps the stock layout: %s" % (
            title, kept_for_any_tp("vLLM's packed multi-group rows (every layer's page of every KV cache group one "
                                   "after the other, as enable_cross_layers_blocks packs them) cannot be sliced by KV "
                                   "heads")), for_any_tp=True)
    if packed_groups:
        return ModelDecision(SLIDING_WINDOW, True, "%s: vLLM's packed multi-group KV allocation (what its "
                                                   "enable_cross_layers_blocks opt-in turns on): each block id's "
                                                   "row holds every layer of every KV cache group, one NIXL region: "
                                                   "1 descriptor per block id" % title)
    return ModelDecision(SLIDING_WINDOW, False, "%s: keeps the stock layout on this vLLM (several KV cache groups: "
                                                "one cross-layer KV tensor needs one group, and vLLM's packed "
                                                "multi-group allocation exists from 0.24 on; where vLLM plans one "
                                                "group because its hybrid KV cache manager is off, e.g. with "
                                                "--disable-hybrid-kv-cache-manager, one cross-layer KV tensor)"
                                 % title)


def sliding_and_full(layer_types: Optional[Tuple[str, ...]], sliding_window) -> bool:
    """Does a config describe sliding-window layers beside full-attention ones (several KV
    cache groups)?  ``layer_types`` as transformers configs spell them; without them a set
    ``sliding_window`` alone means every layer slides (one group), not a hybrid."""
    if not layer_types:
        return False
    sliding = sum(1 for t in layer_types if t in SLIDING_LAYER_TYPES)
    return bool(sliding_window) and 0 < sliding < len(layer_types)


def sparse_backend(names) -> bool:
    """Is one of these attention backend names a sparse-indexer (DSA) backend?"""
    return any(mark in str(n).upper() for n in names for mark in SPARSE_BACKEND_MARKS)


def expected_descriptors(facts: ModelFacts, decision: ModelDecision, *, kv_split: bool) -> Tuple[Optional[int], int]:
    """(stock, with the shim) NIXL descriptors per block id of one KV cache group, before NIXL
    merges consecutive blocks.

    Stock registers one region per attention layer of a group (two where K and V are separate
    regions: ``kv_split``, FlashAttention-style layers on vLLM < 0.26; MLA has one latent
    cache); ``facts.group_layers`` says how many layers a block id spans.
    """
    layers = facts.group_layers
    stock = None if layers is None else layers * (2 if kv_split and not facts.use_mla else 1)
    return stock, (1 if decision.cross_layer else stock)


def facts_from_config(get, *, use_mla: bool, mamba: bool, kv_heads_per_rank: Optional[int] = None,
                      pp_size: int = 1, backends=(), source: str = "engine",
                      kv_cache_groups: Optional[int] = None) -> ModelFacts:
    """ModelFacts from a model's (text) config, read through ``get(name)`` (an attribute of
    vLLM's ``hf_text_config`` or a key of ``config.json``), plus what only the engine knows
    (MLA and Mamba as vLLM classifies the model, KV heads per rank, attention backends)."""
    layer_types = tuple(get("layer_types") or ())
    sparse = get("index_topk") is not None or any(t in SPARSE_LAYER_TYPES for t in layer_types) \
        or sparse_backend(backends)
    sliding = sliding_and_full(layer_types, get("sliding_window"))
    pattern = get("sliding_window_pattern")
    if not layer_types and get("sliding_window") and isinstance(pattern, int) and pattern > 1:
        sliding = True  # older Gemma 3 configs: every pattern-th layer is global
    layers = get("num_hidden_layers")
    group_layers = layers if isinstance(layers, int) else None
    if sliding and layer_types:
        counts = [sum(1 for t in layer_types if t in SLIDING_LAYER_TYPES),
                  sum(1 for t in layer_types if t not in SLIDING_LAYER_TYPES)]
        group_layers = min(counts)
    elif sliding and isinstance(layers, int):
        group_layers = layers // pattern
    return ModelFacts(use_mla=use_mla, sparse_indexer=bool(use_mla and sparse), mamba=mamba,
                      sliding_window=sliding and not use_mla, kv_heads_per_rank=kv_heads_per_rank,
                      pp_size=pp_size or 1, group_layers=group_layers, kv_cache_groups=kv_cache_groups,
                      source=source)
