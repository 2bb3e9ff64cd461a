"""Model shape, its names, and what the shim does for it, decided in one place (pure Python, no vLLM).

A model's KV cache has independent axes (:class:`ModelShape`):

- the **attention kind** of its attention layers (:data:`ATTENTION_KINDS`): ``full``;
  ``sliding-window`` (sliding-window layers beside full-attention ones: a hybrid with several KV
  cache groups); ``mla`` (one latent cache per layer, the same on every tensor-parallel rank);
  ``sparse-mla`` (MLA with a sparse indexer cache);
- **Mamba / linear-attention layers** beside them, or none;
- the **KV heads per tensor-parallel rank**;
- the **KV cache groups** vLLM planned (known to the engine only, once it planned them).

:func:`classify` reads them from a Hugging Face config (a ``config.json`` dict, or vLLM's
``hf_text_config``) at a tensor-parallel size: every door asks it, the patches through
:mod:`xlkv_autopatch.patches._model` (with vLLM's own MLA, Mamba and KV-heads answers), ``python -m
xlkv_autopatch status --model DIR`` and the lab (experiments/) with ``config.json``.  :func:`decide`
says what the shim does for a shape on a release, so what status predicts is what the engine does.

A family is the name of a shape in messages and results files, derived from the axes
(:func:`family`); a sliding-window hybrid at one KV head per rank is named ``sliding-window`` and
still decided as one KV head per rank:

========================  ==================================================================
``dense``                 full attention, two or more KV heads per rank
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

These are the only spellings: the lab's model table (experiments/model_shapes.py) is keyed by
them and results files use them; files written before xlkv 0.8.3 spelled some otherwise
(:data:`ALIASES`, read through :func:`canonical`).
"""

from dataclasses import dataclass, field
from typing import Optional, Tuple

from .layout import BLOCK_OUTERMOST_LAYOUT, HEADS_OUTERMOST_LAYOUT, kept_for_any_tp, sliced_by_heads

# attention kinds: the first axis of a model's shape (sliding-window, mla and sparse-mla are also the names
# of their families)
FULL = "full"
SLIDING_WINDOW = "sliding-window"
MLA = "mla"
SPARSE_MLA = "sparse-mla"
ATTENTION_KINDS = (FULL, SLIDING_WINDOW, MLA, SPARSE_MLA)
#: attention kinds whose KV cache is one latent cache, the same on every tensor-parallel rank
REPLICATED = (MLA, SPARSE_MLA)

# families: the names derived from the axes (Mamba layers name the family whatever the attention kind;
# full attention splits by KV heads per rank)
DENSE = "dense"
ONE_KV_HEAD = "one-kv-head"
MAMBA_HYBRID = "mamba-hybrid"
FAMILIES = (DENSE, ONE_KV_HEAD, SLIDING_WINDOW, MLA, SPARSE_MLA, MAMBA_HYBRID)

#: spellings of results files written before xlkv 0.8.3: the lab's equivalence files (``sliding-hybrid``)
#: and the CPU harness's (``swa``; ``mqa``: one KV head at TP 1)
ALIASES = {"sliding-hybrid": SLIDING_WINDOW, "swa": SLIDING_WINDOW, "mqa": ONE_KV_HEAD}

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
#: model types whose layers include Mamba / linear attention (read where the engine's own ``is_hybrid``
#: is not at hand: ``status --model`` without vLLM, the lab)
HYBRID_MODEL_TYPES = ("bamba", "falcon_h1", "granitemoehybrid", "jamba", "kimi_linear", "lfm2", "mamba", "mamba2",
                      "minimax_m1", "nemotron_h", "plamo2", "qwen3_next", "zamba2")
#: ``layer_types`` marks of such layers
HYBRID_LAYER_MARKS = ("mamba", "linear_attention", "conv")
#: every n-th layer is a full-attention one where a config has a sliding window but neither ``layer_types``
#: nor ``sliding_window_pattern`` (Gemma 2 alternates, Gemma 3 has 5 sliding : 1 full)
INTERLEAVED_MODEL_TYPES = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}


def canonical(name: str) -> str:
    """The package's name for a family spelled ``name`` (an old spelling of :data:`ALIASES`, or itself)."""
    return ALIASES.get(name, name)


@dataclass(frozen=True)
class ModelShape:
    """A model's KV cache shape on one engine: its independent axes and what decisions count with."""

    attention: str = FULL
    #: Mamba / linear-attention layers beside the attention layers (vLLM's ``is_hybrid``)
    mamba: bool = False
    kv_heads_per_rank: Optional[int] = None
    #: KV cache groups vLLM planned for the engine, where known (the KV cache config exists only
    #: once the engine planned it; None for ``status --model``, the lab and the model-runner choice)
    kv_cache_groups: Optional[int] = None
    #: the model's KV heads over all ranks, where known (as vLLM or the config counts them; MLA's latent
    #: cache is replicated on every rank whatever the count)
    kv_heads: Optional[int] = None
    pp_size: int = 1
    #: attention layers that one KV cache group's block id spans, where known (all attention
    #: layers with one group; with sliding-window + full layers vLLM groups them in equal
    #: groups of about the smaller layer-type count): for expected descriptor counts
    group_layers: Optional[int] = None
    #: where the shape came from (engine config, config.json, the lab's record), for messages
    source: str = field(default="engine", compare=False)

    @property
    def family(self) -> str:
        return family(self)

    @property
    def one_kv_head_per_rank(self) -> bool:
        return self.kv_heads_per_rank == 1

    @property
    def replicated(self) -> bool:
        """The KV cache is the same on every tensor-parallel rank (MLA's latent cache)."""
        return self.attention in REPLICATED


def family(shape: ModelShape) -> str:
    """The family name of a shape: Mamba layers make it ``mamba-hybrid``; full attention is ``dense``
    or ``one-kv-head`` by its KV heads per rank; every other attention kind names its family."""
    if shape.mamba:
        return MAMBA_HYBRID
    if shape.attention == FULL:
        return ONE_KV_HEAD if shape.one_kv_head_per_rank else DENSE
    return shape.attention


def heads_per_rank(kv_heads, tp: int = 1) -> Optional[int]:
    """KV heads each of ``tp`` tensor-parallel ranks holds (vLLM's ``get_num_kv_heads``: replicated
    where there are fewer heads than ranks), None where ``kv_heads`` is unknown."""
    if not isinstance(kv_heads, int) or kv_heads <= 0:
        return None
    return max(1, kv_heads // max(1, tp or 1))


def shape(attention: str, *, mamba: bool = False, kv_heads: Optional[int] = None, tp: int = 1, pp: int = 1,
          kv_heads_per_rank: Optional[int] = None, kv_cache_groups: Optional[int] = None,
          group_layers: Optional[int] = None, source: str = "engine") -> ModelShape:
    """A ModelShape from its axes at tensor/pipeline parallel sizes tp/pp (``kv_heads_per_rank`` where
    the engine knows it, else from ``kv_heads``; a replicated latent cache whose heads nobody gave is one
    head, as vLLM >= 0.29 counts it)."""
    if attention not in ATTENTION_KINDS:
        raise ValueError("attention kind %r is not one of %s" % (attention, ", ".join(ATTENTION_KINDS)))
    if attention in REPLICATED and kv_heads is None:
        kv_heads = 1
    if kv_heads_per_rank is None:
        kv_heads_per_rank = heads_per_rank(kv_heads, tp)
    return ModelShape(attention=attention, mamba=bool(mamba), kv_heads_per_rank=kv_heads_per_rank,
                      kv_cache_groups=kv_cache_groups, kv_heads=kv_heads if isinstance(kv_heads, int) else None,
                      pp_size=pp or 1, group_layers=group_layers, source=source)


def text_config(cfg: dict) -> dict:
    """A ``config.json`` dict with a multimodal wrapper's ``text_config`` (the language model's
    fields) read over it."""
    text = cfg.get("text_config")
    return dict(cfg, **text) if isinstance(text, dict) else cfg


def classify(config, *, tp: int = 1, pp: int = 1, use_mla: Optional[bool] = None, mamba: Optional[bool] = None,
             kv_heads: Optional[int] = None, kv_heads_per_rank: Optional[int] = None, backends=(),
             kv_cache_groups: Optional[int] = None, source: str = "engine") -> ModelShape:
    """The model's shape from its Hugging Face config at tensor/pipeline parallel sizes tp/pp: the one
    classifier.  ``config``: a ``config.json`` dict (:func:`text_config` applied) or an object with the
    fields as attributes (vLLM's ``hf_text_config``).  What the engine knows better is passed in where
    known: ``use_mla`` and ``mamba`` as vLLM classifies the model (None: ``kv_lora_rank``; a hybrid model
    type or layer type), the total ``kv_heads`` or vLLM's ``kv_heads_per_rank``, the attention
    ``backends`` (a sparse-indexer backend marks sparse MLA), the ``kv_cache_groups`` vLLM planned."""
    if isinstance(config, dict):
        get = text_config(config).get
    else:
        get = lambda name: getattr(config, name, None)  # noqa: E731
    layer_types = tuple(str(t) for t in get("layer_types") or ())
    if use_mla is None:
        use_mla = get("kv_lora_rank") is not None
    if mamba is None:
        mamba = get("model_type") in HYBRID_MODEL_TYPES or any(
            mark in t for t in layer_types for mark in HYBRID_LAYER_MARKS)
    sparse = get("index_topk") is not None or any(t in SPARSE_LAYER_TYPES for t in layer_types) \
        or sparse_backend(backends)
    sliding = sliding_and_full(layer_types, get("sliding_window"))
    pattern = get("sliding_window_pattern")
    if not isinstance(pattern, int) and not layer_types:
        pattern = INTERLEAVED_MODEL_TYPES.get(get("model_type"))
    if not layer_types and get("sliding_window") and isinstance(pattern, int) and pattern > 1:
        sliding = True  # every pattern-th layer is global (older Gemma configs)
    layers = get("num_hidden_layers")
    group_layers = layers if isinstance(layers, int) else None
    if sliding and layer_types:
        counts = [sum(1 for t in layer_types if t in SLIDING_LAYER_TYPES),
                  sum(1 for t in layer_types if t not in SLIDING_LAYER_TYPES)]
        group_layers = min(counts)
    elif sliding and isinstance(layers, int):
        group_layers = layers // pattern
    if use_mla:
        kind = SPARSE_MLA if sparse else MLA
    else:
        kind = SLIDING_WINDOW if sliding else FULL
    if kv_heads is None and kv_heads_per_rank is None:
        kv_heads = get("num_key_value_heads") or get("num_attention_heads")
    return shape(kind, mamba=mamba, kv_heads=kv_heads, tp=tp, pp=pp, kv_heads_per_rank=kv_heads_per_rank,
                 kv_cache_groups=kv_cache_groups, group_layers=group_layers, source=source)


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


def decide(model: ModelShape, release, *, equal_tp: bool = False) -> ModelDecision:
    """What the shim does for this model shape on a release (``release``: its
    :class:`xlkv_autopatch.facts.ReleaseFacts`, whole).

    The release's columns that count here: ``mechanism == "layout"`` (vLLM 0.29+ chooses KV-cache
    layouts once per engine; before, the shim lays out cross-layer blocks), ``packed_groups``
    (vLLM's packed multi-group KV allocation, 0.24-0.28, which the shim turns on for sliding-window
    hybrids where every peer runs this engine's TP size: ``equal_tp``, XLKV_EQUAL_TP; packed rows
    cannot be sliced by KV heads, so without it they keep the stock layout and any TP pairing is
    served) and ``mla_cross_layer_backends`` (the MLA attention backends whose cross-layer blocks
    xlkv turns on, 0.26-0.28; the patch checks the engine's backend against them).  Only the model's
    shape is decided here; the attention backend (:func:`kept_stock_for_any_tp`), host-buffer mode,
    the kernel block and the user's explicit settings are checked by the patches.
    """
    fam = family(model)
    title = TITLES[fam]
    kind = model.attention
    if model.mamba:
        return ModelDecision(fam, False, "%s: keeps the stock layout (Mamba state pages and attention pages do not "
                                         "share one row layout that vLLM's NIXL code is proven on)" % title)
    if kind == SPARSE_MLA:
        return ModelDecision(fam, False, "%s: keeps the stock layout (vLLM's sparse indexer kernels assume compact "
                                         "per-layer rows under block-outermost layouts: vLLM issues #55431, #55528)"
                             % title)
    if release.mechanism != "layout":
        mla_backends = release.mla_cross_layer_backends
        if kind == MLA and mla_backends:
            if model.pp_size > 1:
                return ModelDecision(fam, False, "%s with pipeline parallel size %d: keeps the stock layout (xlkv's "
                                                 "MLA cross-layer blocks are not proven with pipeline stages)"
                                     % (title, model.pp_size))
            return ModelDecision(fam, True, "%s: one cross-layer latent KV tensor, 1 descriptor per block, on the MLA "
                                            "backends run with it on a GPU (%s; vLLM's own NIXL opt-in has no MLA backend "
                                            "here)" % (title, ", ".join(mla_backends)))
        if kind == MLA:
            return ModelDecision(fam, False, "%s: keeps the stock layout on this vLLM (cross-layer blocks here are "
                                             "allocated for FlashAttention-style K/V layers only)" % title)
        if kind == SLIDING_WINDOW:
            return _sliding_window_before_layouts(model, title, release.packed_groups, equal_tp)
        return ModelDecision(fam, True, "%s: one cross-layer KV tensor, 1 descriptor per block" % title)
    # vLLM >= 0.29: a block-outermost layout; what vLLM registers decides the gain
    if kind == MLA:
        if model.pp_size > 1:
            return ModelDecision(fam, False, "%s with pipeline parallel size %d: keeps the stock layout (vLLM "
                                             "registers per-layer pages of a packed MLA row when pipeline stages "
                                             "route layers; not proven here)" % (title, model.pp_size))
        return ModelDecision(fam, True, "%s: block-outermost %s, vLLM registers each block's packed latent row as "
                                        "one region: 1 descriptor per block (the latent cache is replicated on "
                                        "every tensor-parallel rank: any prefill/decode TP pairing reads one rank)"
                             % (title, BLOCK_OUTERMOST_LAYOUT), layout=BLOCK_OUTERMOST_LAYOUT)
    one_head = model.one_kv_head_per_rank
    if one_head and model.pp_size > 1:
        return ModelDecision(fam, False, "%s, one KV head per tensor-parallel rank, pipeline parallel size %d: keeps "
                                         "the stock layout (vLLM registers a block-outermost layout as one NIXL region "
                                         "per layer when a layer's page is contiguous, and xlkv registers the row as "
                                         "one region only without pipeline stages)" % (title, model.pp_size))
    if kind == SLIDING_WINDOW:
        what = ("every KV cache group shares one whole-row region: 1 descriptor per block id (sliding-window groups "
                "send their in-window blocks only)")
        if one_head:  # both axes: the groups' shared row and the one-head registration
            what += "; one KV head per tensor-parallel rank: xlkv has vLLM register each row as one region"
    elif one_head:
        what = ("xlkv has vLLM register each block's row as one region (vLLM alone registers a contiguous page per "
                "layer at one KV head per rank): 1 descriptor per block")
    else:
        what = "one whole-row region: 1 descriptor per block"
    return ModelDecision(fam, True, "%s: block-outermost %s with the KV heads outermost in each block row, %s; "
                                    "heterogeneous TP: 1 descriptor per block per remote rank (a remote rank's "
                                    "heads are one range of the row)" % (title, HEADS_OUTERMOST_LAYOUT, what),
                         layout=HEADS_OUTERMOST_LAYOUT, whole_rows=one_head)


def _sliding_window_before_layouts(model: ModelShape, title: str, packed_groups: bool,
                                   equal_tp: bool) -> ModelDecision:
    """vLLM 0.12-0.28, sliding-window + full attention: one cross-layer KV tensor where vLLM planned
    one KV cache group (its hybrid KV cache manager off), vLLM's packed multi-group allocation
    where the release has it (0.24-0.28) and every peer runs this TP size, else the stock layout."""
    if model.kv_cache_groups == 1:
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


def kept_stock_for_any_tp(backend: str, release, *, equal_tp: bool) -> Optional[str]:
    """vLLM 0.12-0.28, a model that takes cross-layer blocks (:func:`decide`) on attention ``backend``:
    why the engine keeps the stock layout instead, or None.  Where the backend's cross-layer block
    cannot be sliced by KV heads (``layout.sliced_by_heads`` with the release's ``fa_heads_outermost``:
    every backend but FLASH_ATTN, and FLASH_ATTN on 0.23-0.25) a peer at another TP size would be
    refused, and an engine cannot know its peers' TP size at start-up, so the stock layout serves every
    pairing (``layout.kept_for_any_tp``: an INFO line); None where the block can be sliced or
    ``equal_tp`` (XLKV_EQUAL_TP: every peer runs this TP size).  The run-time preference
    (patches/cross_layer_preference.py) and ``status --model`` both ask it."""
    if equal_tp:
        return None
    why = sliced_by_heads(backend=backend, fa_heads_outermost=release.fa_heads_outermost)
    return kept_for_any_tp(why) if why else None


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


def expected_descriptors(model: ModelShape, decision: ModelDecision, *,
                         kv_split_regions: bool) -> Tuple[Optional[int], int]:
    """(stock, with the shim) NIXL descriptors per block id of one KV cache group, before NIXL
    merges consecutive blocks.

    Stock registers one region per attention layer of a group (two where K and V are separate
    regions: ``kv_split_regions``, FlashAttention-style layers on vLLM < 0.26; MLA has one latent
    cache); ``model.group_layers`` says how many layers a block id spans.
    """
    layers = model.group_layers
    stock = None if layers is None else layers * (2 if kv_split_regions and not model.replicated else 1)
    return stock, (1 if decision.cross_layer else stock)
