"""NixlConnector.register_kv_caches: one region per block row at one KV head per rank (vLLM 0.29+).

Why
    Under a block-outermost layout (BLNHC) every block is one row holding each layer's page.
    vLLM's NIXL worker registers that row as ONE region, 1 descriptor per block, only where a
    layer's page is not contiguous on its own; a contiguous page gets a region of its own, one
    per layer (0.33.0 ``nixl/base_worker.py``: ``page_contiguous`` :1675-1679, whole-row branch
    :1704-1715, per-layer branch :1716-1719).  A page ``[heads, tokens, content]`` in
    token-major BLNHC is contiguous exactly when a rank holds one KV head: MQA, or GQA at a TP
    size >= the KV heads (Llama-3.1-70B at TP 8).  There vLLM registers one region per layer
    under BLNHC (80 descriptors per block for Llama-70B, and consecutive blocks no longer merge),
    so families.py kept the stock layout for these models.  0.29.0 decides by strides instead
    (``hnc_contiguous`` :1224-1228, which also reads the size-1 head dimension's stride) and takes
    the whole-row branch (:1229-1237) for vLLM's own views at one head already.  Measured on the
    CPU harness (2 KV heads at TP 2 -> 2, ``experiments/results/2026-11-25-one-kv-head-cpu-*.json``):
    ``VLLM_KV_CACHE_LAYOUT=BLNHC`` registers 4 regions (one per layer) on 0.33.0 and 1 on 0.29.0;
    with this patch 1 on both, bytes exact.
How
    The connector's ``register_kv_caches`` (``nixl/connector.py``, 0.29.0 :233-235, 0.33.0
    :241-243: it calls the worker's) is wrapped; vLLM's region loop is neither copied nor
    replaced.  Where the worker's layout is a whole-row one (BLNHC, BHLNC), the model is of the
    one-KV-head family with ``cross_layer`` (families.decide: no pipeline parallelism), the worker
    is neither MLA, Mamba, CSA-linear nor host-buffer, and the views fit (every view
    ``[blocks, 1, tokens, content]`` over ONE storage with one block stride, the pages at distinct
    offsets tiling each row exactly: ``layout.row_tiling``), the wrapper hands the worker, instead
    of each view whose page is contiguous, a view with the same shape, the same storage, the same
    ``data_ptr``, ``nbytes`` and block stride, that walks each page content-major
    (``layout.column_major_page_strides``: the same bytes, but its page is not contiguous).  Its
    own whole-row branch then registers ``(storage base, block stride, block stride)`` and
    deduplicates every layer into that one region (0.33.0 :1744-1760; 0.29.0 :1259-1266), and
    every field downstream comes from vLLM's own code exactly as for two KV heads per rank:
    ``block_len_per_layer``/``block_stride_per_layer``/``region_num_blocks``, the local strided
    descriptors (``register_local_xfer_handler`` -> ``_build_fa_local``, 0.33.0 :1899, :2171),
    ``_compute_desc_ids``' fast path (region offset + block id, :140-230), the remote descriptors
    (``_build_fa_remote`` :2196: at equal TP one source rank and rank offset 0,
    ``tp_mapping.py`` :74-82, :100-115) and the published metadata.  What else reads the views
    during the call sees no difference: the TransferTopology's ``tensor_shape`` (same shape;
    0.33.0 :1497), ``_share_storage_and_block_stride`` (storage and stride(0)), the loop's
    storage, device, ``data_ptr``, ``nbytes``, ``stride(0)``, ``shape[0]``.  The worker keeps the
    dict it was given as ``device_kv_caches`` (0.33.0 :1874; 0.29.0 :1334), read later by the
    receive post-processing and ``_zero_region_blocks`` (0.33.0 :3063-3130, :3180): the wrapper
    puts vLLM's own views back there after the call.  Host-buffer mode, the one path that copies
    from the views' shapes (``initialize_host_xfer_buffer``, :1519-1523), is never changed.
    After the call the wrapper checks that vLLM registered exactly one region of one row per
    block, else it refuses to start (the published hash would claim that registration).  The
    worker's compatibility hash, computed inside the call (0.33.0 :1508; 0.29.0 :1106), is
    tagged as this registration (compat_hash.py, ``layout.ROW_AT_ONE_KV_HEAD``): a peer that
    registers the same layout per layer (an xlkv without this patch beside
    ``VLLM_KV_CACHE_LAYOUT=BLNHC``) or stock vLLM refuses the handshake, and handshake.py names
    the cause.  Heterogeneous TP stays refused: vLLM refuses it itself for a layout that is not
    block-contiguous (0.33.0 :2834-2845), and handshake.py refuses it first, naming heterogeneous
    TP, for every whole-row worker (a TP 1 -> 2 pair with two KV heads publishes two different
    tags and is refused at the hash as heterogeneous TP).
vLLM versions
    0.29+ (``NixlBaseConnector.register_kv_caches``, ``nixl.connector``).  0.30.0, 0.31.0 and
    0.32.0 (read from their wheels, not run) decide by the same ``page_contiguous`` test as
    0.33.0 (``nixl/base_worker.py`` :1438, :1626, :1555) and take the same whole-row branch;
    where a release registered otherwise, the check after the call refuses to start.
Removal
    When vLLM registers a block-outermost row as one region whatever the heads per rank (its
    whole-row branch without the ``page_contiguous`` condition for a replicated-or-one-head
    page at equal TP).
"""

from .. import facts, families, layout
from ..errors import XlkvRegistrationError
from ..logs import info_once
from . import _model, _state
from ._args import bind


def _applies(worker, f):
    """Is this worker's registration one this patch changes (before looking at its views)?"""
    if worker is None or not f.kv_cache_layouts:
        return False
    if getattr(worker, "kv_cache_layout", None) not in layout.WHOLE_ROW_LAYOUTS:
        return False
    if any(getattr(worker, name, False) for name in ("use_mla", "_has_mamba", "_is_csa_linear", "use_host_buffer")):
        return False
    decision = _model.decision(getattr(worker, "vllm_config", None))
    return decision is not None and decision.family == families.ONE_KV_HEAD and decision.cross_layer


def row_views(kv_caches):
    """(the views to hand vLLM, bytes per row) where the views are pages of one row each, else
    (None, why not).  A view whose page is already not contiguous is handed over as it is."""
    views = list(kv_caches.values())
    if not views or not all(hasattr(v, "untyped_storage") and getattr(v, "ndim", 0) == 4 for v in views):
        return None, "the KV caches are not 4-D tensors"
    if any(v.shape[1] != 1 for v in views):
        return None, "a view holds %s KV heads, not one" % sorted({int(v.shape[1]) for v in views})
    storages = {v.untyped_storage().data_ptr() for v in views}
    strides = {v.stride(0) * v.element_size() for v in views}
    pages = {v[0].nbytes for v in views}
    if len(storages) != 1 or len(strides) != 1 or len(pages) != 1:
        return None, ("the views do not share one storage, block stride and page size (%d storages, strides %s, "
                      "pages %s)" % (len(storages), sorted(strides), sorted(pages)))
    (base,), (row,), (page,) = storages, strides, pages
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


def _check(worker, row, layers):
    regions = getattr(worker, "num_regions", None)
    lens = list(getattr(worker, "block_len_per_layer", []) or [])
    block_strides = list(getattr(worker, "block_stride_per_layer", []) or [])
    if regions != 1 or lens != [row] or block_strides != [row]:
        raise XlkvRegistrationError(
            "xlkv_autopatch: vLLM registered the one-KV-head block rows as %s region(s) (block lengths %s, strides %s), "
            "not one region of %d bytes per block, and this engine's compatibility hash says one region. Fix: set "
            "VLLM_KV_CACHE_LAYOUT=LBHNC (the stock layout) or unset ENABLE_XLKV on prefill and decode"
            % (regions, lens[:4], block_strides[:4], row))
    info_once("page-contiguous", "one KV head per tensor-parallel rank: each block's row (%d layers, %d bytes) is one "
              "NIXL region, 1 descriptor per block (vLLM alone registers a contiguous page as a region of its own: "
              "%d per block); prefill and decode need the same tensor-parallel size", layers, row, layers)


def register_wrapper(wrapped, instance, args, kwargs):
    (kv_caches,) = bind(args, kwargs, "kv_caches")
    worker = getattr(instance, "connector_worker", None)
    if not isinstance(kv_caches, dict) or not _applies(worker, facts.current()):
        return wrapped(*args, **kwargs)
    views, row = row_views(kv_caches)
    if views is None:  # vLLM's registration, untouched; block_count.py warns if it is per layer
        info_once("page-contiguous:" + row, "one KV head per tensor-parallel rank, but the block rows are left to "
                  "vLLM's registration: %s", row)
        return wrapped(*args, **kwargs)
    if "kv_caches" in kwargs:
        kwargs = dict(kwargs, kv_caches=views)
    else:
        args = (views,) + tuple(args[1:])
    try:
        with _state.registering_rows():
            result = wrapped(*args, **kwargs)
    finally:
        if getattr(worker, "device_kv_caches", None) is views:
            worker.device_kv_caches = kv_caches  # vLLM's own views, for everything after registration
    _check(worker, row, len({v.data_ptr() for v in kv_caches.values()}))
    return result
