"""NixlConnector.register_kv_caches: heads-outermost block rows as one region each (vLLM 0.29+).

Why
    Under a block-outermost layout every block is one row holding each layer's page.  vLLM's
    NIXL worker registers that row as ONE region, 1 descriptor per block, only where a layer's
    page is not contiguous on its own; a contiguous page gets a region of its own, one per layer
    (0.33.0 ``nixl/base_worker.py``: ``page_contiguous`` :1675-1679, whole-row branch :1704-1715,
    per-layer branch :1716-1719).  In xlkv's heads-outermost ``BHLNC`` rows (``[B, H, L, N, C]``,
    families.py) a layer's page ``[H, N, C]`` is contiguous exactly when a rank holds one KV head:
    MQA, or GQA at a TP size >= the KV heads (Llama-3.1-70B, gpt-oss at TP 8).  There vLLM would
    register one region per layer (80 descriptors per block for Llama-70B; consecutive blocks no
    longer merge), and a peer at another TP size, holding two heads per rank and so registering
    whole rows, would not match it.  0.29.0 decides by strides instead (``hnc_contiguous``
    :1224-1228, which also reads the size-1 head dimension's stride) and takes the whole-row
    branch (:1229-1237) for vLLM's own views at one head already.  A whole row is sliceable by
    heads for heterogeneous TP (block_contiguous.py, handshake.py) only if each head's data for
    every layer is one run of ``row / heads`` bytes: no padding, every KV cache group's layers
    tiling the run; vLLM pads rows to page alignments and groups may hold different layer counts.
How
    The connector's ``register_kv_caches`` (``nixl/connector.py``, 0.29.0 :233-235, 0.33.0
    :241-243: it calls the worker's) is wrapped; vLLM's region loop is neither copied nor
    replaced.  For a worker whose layout is a whole-row one (BLNHC, BHLNC), whose model is
    ``cross_layer`` for families.decide, neither MLA, Mamba, CSA-linear nor host-buffer:
    (1) at one KV head per rank (``whole_rows``; families.decide: no pipeline parallelism), where
    the views fit (every view ``[blocks, 1, tokens, content]`` over ONE storage with one block
    stride, the pages at distinct offsets tiling each row exactly: ``layout.row_tiling``), the
    wrapper hands the worker, instead of each view whose page is contiguous, a view with the
    same shape, the same storage, the same ``data_ptr``, ``nbytes`` and block stride, that walks
    each page content-major (``layout.column_major_page_strides``: the same bytes, but its page is
    not contiguous).  Its own whole-row branch then registers ``(storage base, block stride,
    block stride)`` and deduplicates every layer into that one region (0.33.0 :1744-1760; 0.29.0
    :1259-1266), and every field downstream comes from vLLM's own code exactly as for two KV
    heads per rank.  What else reads the views during the call sees no difference: the
    TransferTopology's ``tensor_shape`` (same shape; 0.33.0 :1497),
    ``_share_storage_and_block_stride`` (storage and stride(0)), the loop's storage, device,
    ``data_ptr``, ``nbytes``, ``stride(0)``, ``shape[0]``.  The worker keeps the dict it was
    given as ``device_kv_caches`` (0.33.0 :1874; 0.29.0 :1334), read later by the receive
    post-processing and ``_zero_region_blocks`` (0.33.0 :3063-3130, :3180): the wrapper puts
    vLLM's own views back there after the call.  Host-buffer mode, the one path that copies from
    the views' shapes (``initialize_host_xfer_buffer``, :1519-1523), is never changed.  (2) After
    the call: where (1) handed the views over, vLLM registered exactly one region of one row per
    block, else the engine refuses to start (the published hash, compat_hash.py, claims that
    registration); on ``BHLNC`` one region of one row must have been registered and the heads must
    tile the row (``layout.heads_tile_row`` from the views' head
    stride and page offsets): the worker is marked heads-outermost, which handshake.py needs to
    serve heterogeneous TP, and block_size_restage.attach marks it for the receive restage (a
    peer with smaller blocks); where they do not (padding, uneven groups), equal TP is served and
    heterogeneous TP refused with that cause (an INFO line says so at start-up).  (3) Before the
    call, an explicit ``VLLM_KV_CACHE_LAYOUT`` (which vLLM reads before it asks the connector, so
    kv_cache_layout.py never runs) is said: a stock layout with a WARNING (XLKV_STRICT=1: an
    error: this engine would run stock with the flag on), a whole-row one with an INFO line.
vLLM versions
    0.29+ (``NixlBaseConnector.register_kv_caches``, ``nixl.connector``).  0.30.0, 0.31.0 and
    0.32.0 (read from their wheels, not run) decide by the same ``page_contiguous`` test as
    0.33.0 (``nixl/base_worker.py`` :1438, :1626, :1555) and take the same whole-row branch;
    where a release registered otherwise, the check after the call refuses to start.
Removal
    When vLLM registers a block-outermost row as one region whatever the heads per rank (its
    whole-row branch without the ``page_contiguous`` condition) and lets heads-outermost rows
    through its heterogeneous-TP gate (block_contiguous.py).
"""

from .. import facts, layout
from ..errors import XlkvRegistrationError
from ..logs import info_once
from ..specs import NIXL_CONNECTOR_MODULE, Target
from . import _model, _state, block_size_restage
from ._args import bind
from ._fallback import explicit_layout


def _decision(worker, f):
    """families.decide for a worker whose registration this patch checks (a whole-row layout, the
    model's cross-layer decision, no MLA / Mamba / host buffer), else None."""
    if worker is None or f.mechanism != "layout":
        return None
    if getattr(worker, "kv_cache_layout", None) not in layout.WHOLE_ROW_LAYOUTS:
        return None
    if any(getattr(worker, name, False) for name in ("use_mla", "_has_mamba", "_is_csa_linear", "use_host_buffer")):
        return None
    decision = _model.decision(getattr(worker, "vllm_config", None))
    return decision if decision is not None and decision.cross_layer else None


def _geometry(kv_caches):
    """(views, base, row bytes, page bytes) of views that are pages of one row each, or (None, why not)."""
    views = list(kv_caches.values())
    if not views or not all(hasattr(v, "untyped_storage") and getattr(v, "ndim", 0) == 4 for v in views):
        return None, "the KV caches are not 4-D tensors"
    storages = {v.untyped_storage().data_ptr() for v in views}
    strides = {v.stride(0) * v.element_size() for v in views}
    pages = {v[0].nbytes for v in views}
    if len(storages) != 1 or len(strides) != 1 or len(pages) != 1:
        return None, ("the views do not share one storage, block stride and page size (%d storages, strides %s, "
                      "pages %s)" % (len(storages), sorted(strides), sorted(pages)))
    (base,), (row,), (page,) = storages, strides, pages
    return (views, base, row, page), None


def row_views(kv_caches):
    """(the views to hand vLLM, bytes per row) where the views are pages of one row each at one KV
    head, else (None, why not).  A view whose page is already not contiguous is handed over as it is."""
    geometry, why = _geometry(kv_caches)
    if geometry is None:
        return None, why
    views, base, row, page = geometry
    if any(v.shape[1] != 1 for v in views):
        return None, "a view holds %s KV heads, not one" % sorted({int(v.shape[1]) for v in views})
    why = layout.row_tiling([v.data_ptr() - base for v in views], page, row)
    if why:
        return None, why
    held = views[0].untyped_storage().nbytes() // row
    if held != views[0].shape[0]:
        return None, "the storage holds %d rows, the views %d blocks" % (held, views[0].shape[0])
    out = {}
    for name, v in kv_caches.items():
        if not v[0].is_contiguous():
            out[name] = v
            continue
        try:
            strides = layout.column_major_page_strides(tuple(v.shape), tuple(v.stride()))
        except ValueError as e:
            return None, str(e)
        walked = v.as_strided(tuple(v.shape), strides, v.storage_offset())
        if walked.data_ptr() != v.data_ptr() or walked.nbytes != v.nbytes or walked[0].is_contiguous():
            return None, "a content-major view of %s is not the same bytes with a non-contiguous page" % name
        out[name] = walked
    return out, row


def heads_tiling(kv_caches):
    """None where the views' KV heads tile their rows ``[H, L, N, C]`` exactly (layout.heads_tile_row),
    else why not."""
    geometry, why = _geometry(kv_caches)
    if geometry is None:
        return why
    views, base, row, page = geometry
    heads = {int(v.shape[1]) for v in views}
    head_strides = {v.stride(1) * v.element_size() for v in views}
    if len(heads) != 1 or len(head_strides) != 1:
        return "the views disagree on their KV heads %s or head strides %s" % (sorted(heads), sorted(head_strides))
    (h,), (stride,) = heads, head_strides
    return layout.heads_tile_row(heads=h, head_stride=stride, page_offsets=[v.data_ptr() - base for v in views],
                                 page_bytes=page, row_bytes=row)


def _one_row_region(worker):
    """(the row's bytes, None) where vLLM registered one region of one row per block, else (None, what it
    registered)."""
    regions = getattr(worker, "num_regions", None)
    lens = list(getattr(worker, "block_len_per_layer", []) or [])
    block_strides = list(getattr(worker, "block_stride_per_layer", []) or [])
    if regions == 1 and len(lens) == 1 and lens == block_strides:
        return lens[0], None
    return None, "%s region(s) (block lengths %s, strides %s)" % (regions, lens[:4], block_strides[:4])


#: NixlConnector.register_kv_caches's parameters after self, bound by name
REGISTER_ARGS = ("kv_caches",)


def register_wrapper(wrapped, instance, args, kwargs):
    (kv_caches,) = bind(args, kwargs, *REGISTER_ARGS)
    explicit_layout()  # an explicit VLLM_KV_CACHE_LAYOUT decided the layout without kv_cache_layout.py: say so
    worker = getattr(instance, "connector_worker", None)
    decision = _decision(worker, facts.current()) if isinstance(kv_caches, dict) else None
    if decision is None:
        return wrapped(*args, **kwargs)
    kv_layout = worker.kv_cache_layout
    views = None
    if decision.whole_rows:
        views, row = row_views(kv_caches)
        if views is None:  # vLLM's registration, untouched; the check below refuses a per-layer one
            info_once("page-contiguous:" + row, "one KV head per tensor-parallel rank, but the block rows are left "
                      "to vLLM's registration: %s", row)
    if views is not None:
        if "kv_caches" in kwargs:
            kwargs = dict(kwargs, kv_caches=views)
        else:
            args = (views,) + tuple(args[1:])
    try:
        result = wrapped(*args, **kwargs)
    finally:
        if views is not None and getattr(worker, "device_kv_caches", None) is views:
            worker.device_kv_caches = kv_caches  # vLLM's own views, for everything after registration
    row, registered = _one_row_region(worker)
    if decision.whole_rows and registered:  # the published hash (compat_hash.py) says one region per row
        raise XlkvRegistrationError(
            "xlkv_autopatch: vLLM registered the %s block rows at one KV head per rank as %s, not one region of one "
            "row per block, and this engine's compatibility hash says one region per row. Fix: set "
            "VLLM_KV_CACHE_LAYOUT=LBHNC (the stock layout) or unset ENABLE_XLKV on prefill and decode"
            % (kv_layout, registered))
    layers = len({v.data_ptr() for v in kv_caches.values()})
    if views is not None:
        info_once("page-contiguous", "one KV head per tensor-parallel rank: each block's row (%d layers, %d bytes) is "
                  "one NIXL region, 1 descriptor per block (vLLM alone registers a contiguous page as a region of "
                  "its own: %d per block)", layers, row, layers)
    if kv_layout == layout.HEADS_OUTERMOST_LAYOUT:
        why = ("vLLM registered %s, not one region per block row" % registered) if registered else \
            heads_tiling(kv_caches)
        _state.mark_heads_outermost(worker, why)
        if why is None:
            block_size_restage.attach(worker, kv_caches)  # a peer with smaller blocks: its rows restaged
            info_once("heads-outermost", "%s rows of %d bytes, one NIXL region, the KV heads outermost in each row: "
                      "any prefill/decode TP pairing that vLLM serves reads 1 descriptor per block per remote rank",
                      kv_layout, row)
        else:
            info_once("heads-not-sliceable", "%s rows; heterogeneous TP will be refused at the handshake: %s",
                      kv_layout, why)
    return result


#: what this file wraps: NixlConnector's registration, on the KV-cache-layout releases (the release
#: table's ``mechanism``)
TARGETS = (
    Target(name="page_contiguous.block_rows", group="nixl", module=NIXL_CONNECTOR_MODULE, owner="NixlConnector",
           attr="register_kv_caches", kind="method", wrapper=register_wrapper, params=("self",) + REGISTER_ARGS,
           when={"mechanism": "layout"}),
)
