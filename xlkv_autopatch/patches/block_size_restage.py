"""The NIXL worker's receive post-processing: restage heads-outermost rows read from a peer with
smaller blocks (vLLM 0.29+).

Why
    Where a decode block holds R = decode / prefill block size prefill blocks, vLLM reads each
    prefill block whole into one of R equal byte parts of the decode block (its second local
    descriptor list, ``register_local_xfer_handler(remote_block_size)``), then reorders each
    layer's block into token order on receive (``kv_postprocess_blksize_on_receive``) for its
    block-contiguous layouts only.  xlkv's ``BHLNC`` rows (one region per block, patches/
    page_contiguous.py) take the same R descriptors per decode block and per remote rank (stock
    LBHNC: R per layer), but each part holds a whole prefill row ``[H][L][n][C]``, so the decode
    row arrives as ``[R][H][L][n][C]`` where vLLM's per-layer views read ``[H][L][R*n][C]``: every
    token but the first part's lands in the wrong place.  vLLM's per-layer reorder cannot fix it
    (each part holds every layer): 0.33 skips it for ``BHLNC``; 0.29 runs it on every layout and
    reads its views' dims wrongly; and 0.29's tail zeroing (``cache[last_block_id, zero_from:]``)
    takes the head dim of these views for the tokens (docs/mechanism.md, "Different block sizes on
    prefill and decode").
How
    The worker's ``post_process_device_kv_on_receive(block_size_ratio, block_ids_list, convert)``
    is wrapped; vLLM's body is neither copied nor replaced.  For a worker this module marked
    (``attach``: page_contiguous.py registered its ``BHLNC`` rows as one region each whose heads
    tile them; ``_state.mark_restages``, which handshake.py asks before it lets a peer with other
    block sizes through) and ``block_size_ratio > 1``: for each item (0.29: ``(block ids,
    covered)``; 0.33: ``(group, block ids, covered)``, covered counting remote blocks) the rows of
    the blocks the transfer wrote (``ceil(covered / R)``; later rows are not touched) are gathered
    from the rows' one storage (one ``index_select`` on the device tensor), permuted from
    ``[R][H][L][n][C]`` to ``[H][L][R][n][C]`` (``block_sizes.staged_order``) and written back;
    the tokens past ``covered`` in the last written row (its parts that no prefill block filled)
    are zeroed on the row (``[H][L][N][C]``, tokens on dim 2).  vLLM's own function then runs with
    ``convert=False`` (no per-layer conversion) and each item's covered count rounded up to whole
    decode blocks: its zeroing of the blocks past the covered ones is unchanged (the same first
    stale block), its in-block tail zeroing, which 0.29 and 0.31 do on dim 1 of the per-layer
    ``[B, H, N, C]`` views (the heads), does not run.  Any other worker or ratio: vLLM's call,
    untouched.
vLLM versions
    0.29+ (``post_process_device_kv_on_receive`` with ``convert``, on ``NixlBaseConnectorWorker``;
    read in 0.29.0, 0.31.0 and 0.33.0; the harness runs of 0.29.0 and 0.33.0 are in
    experiments/results/2026-11-29-block-sizes-shim-cpu-*.json).  0.12-0.28's cross-layer blocks are
    refused at the handshake instead (layout.block_sizes_served).
Removal
    When vLLM restages whole-row layouts itself on receive (its block-size post-processing for
    ``BHLNC`` rows read whole per remote block).
"""

from .. import block_sizes, layout
from ..logs import info_once
from ..specs import NIXL_WORKER_CLASS, NIXL_WORKER_MODULE, Target
from . import _state
from ._args import bind

#: the worker attribute with the rows' geometry, set by ``attach``
GEOMETRY = "_xlkv_restage_geometry"


def row_geometry(kv_caches, block_size):
    """(geometry, None) for ``BHLNC`` per-layer views ``[B, H, N, C]`` over one storage of rows, one
    block stride apart, else (None, why not): geometry = dict(rows, row bytes, H, L, N, C bytes)."""
    views = list(kv_caches.values()) if isinstance(kv_caches, dict) else []
    if not views or not all(hasattr(v, "untyped_storage") and getattr(v, "ndim", 0) == 4 for v in views):
        return None, "the KV caches are not 4-D views"
    v = views[0]
    row = v.stride(0) * v.element_size()
    if {u.stride(0) * u.element_size() for u in views} != {row} or \
            len({u.untyped_storage().data_ptr() for u in views}) != 1:
        return None, "the views do not share one storage and block stride"
    heads, tokens, content = int(v.shape[1]), int(v.shape[2]), int(v.shape[3]) * v.element_size()
    if tokens != block_size:
        return None, "the views hold %d tokens per block, the worker's blocks %d" % (tokens, block_size)
    layers, rest = divmod(row, heads * tokens * content)
    if rest or layers < 1:
        return None, "a %d-byte row is not %d heads x L layers x %d tokens x %d bytes" % (row, heads, tokens, content)
    rows = v.untyped_storage().nbytes() // row
    if rows < int(v.shape[0]):
        return None, "the storage holds %d rows, the views %d blocks" % (rows, int(v.shape[0]))
    return dict(rows=int(v.shape[0]), row=row, H=heads, L=layers, N=tokens, C=content), None


def attach(worker, kv_caches):
    """Called by page_contiguous.py after vLLM registered ``BHLNC`` rows as one region each whose heads
    tile them: mark the worker (``_state.mark_restages``) where this module's wrapper is on its class
    and the views give the rows' geometry."""
    if not _wrapped(worker):
        return
    geometry, why = row_geometry(kv_caches, getattr(worker, "block_size", None))
    if geometry is None:
        info_once("restage-rows:" + why, "%s rows: a peer with smaller blocks will be refused at the handshake: %s",
                  layout.HEADS_OUTERMOST_LAYOUT, why)
        return
    setattr(worker, GEOMETRY, geometry)
    _state.mark_restages(worker)


def _wrapped(worker):
    """The worker's class has xlkv's wrapper of the receive post-processing (only this module wraps it)."""
    from ..registry import OURS
    for klass in type(worker).__mro__:
        raw = vars(klass).get(ATTR)
        if raw is not None:
            return isinstance(raw, OURS)
    return False


def _rows(worker, geometry):
    """The rows' storage as a ``[rows, row bytes]`` uint8 tensor (the views' storage from its start)."""
    import torch
    v = next(iter(worker.device_kv_caches.values()))
    storage = v.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=v.device).set_(
        storage, 0, (geometry["rows"], geometry["row"]), (geometry["row"], 1))


def restage(rows, block_ids, covered, ratio, geometry):
    """Permute the rows the transfer wrote (``covered`` remote blocks into ``block_ids``' R parts each)
    from ``[R][H][L][n][C]`` to ``[H][L][R][n][C]`` in place, and zero each written row's tokens past
    ``covered``.  Returns the row ids permuted."""
    import torch
    full, part = divmod(covered, ratio)
    ids = list(block_ids)[:full + (1 if part else 0)]
    if not ids:
        return ids
    names, perm = block_sizes.staged_order("HLNC", ratio)
    sizes = dict(geometry, R=ratio, N=geometry["N"] // ratio)
    idx = torch.tensor(ids, dtype=torch.long, device=rows.device)
    staged = rows.index_select(0, idx).view(len(ids), *[sizes[a] for a in names])
    rows.index_copy_(0, idx, staged.permute(0, *[p + 1 for p in perm]).reshape(len(ids), geometry["row"]))
    if part:
        last = rows[ids[-1]].view(geometry["H"], geometry["L"], geometry["N"], geometry["C"])
        last[:, :, part * sizes["N"]:].zero_()
    return ids


#: post_process_device_kv_on_receive's parameters after self, bound by name
RECEIVE_ARGS = ("block_size_ratio", "block_ids_list", "convert")
ATTR = "post_process_device_kv_on_receive"


def receive_wrapper(wrapped, instance, args, kwargs):
    ratio, items, _convert = bind(args, kwargs, *RECEIVE_ARGS)
    geometry = getattr(instance, GEOMETRY, None)
    if not (isinstance(ratio, int) and ratio > 1 and _state.restages(instance) and geometry and items):
        return wrapped(*args, **kwargs)
    if geometry["N"] % ratio:
        raise ValueError("xlkv_autopatch: %d-token rows cannot hold %d remote blocks" % (geometry["N"], ratio))
    rows = _rows(instance, geometry)
    handed = []
    for item in items:
        *group, block_ids, covered = item
        written = restage(rows, block_ids, covered, ratio, geometry)
        handed.append(tuple(group) + (block_ids, len(written) * ratio if covered % ratio else covered))
    info_once("restaged", "received %s rows from a peer with %d-times smaller blocks put in token order on receive "
              "(%d descriptors per block per remote rank)", layout.HEADS_OUTERMOST_LAYOUT, ratio, ratio)
    return wrapped(ratio, handed, False)


#: what this file wraps: the NIXL worker's receive post-processing, on the KV-cache-layout releases
#: (the release table's ``mechanism``)
TARGETS = (
    Target(name="block_size_restage.receive", group="nixl", module=NIXL_WORKER_MODULE, owner=NIXL_WORKER_CLASS,
           attr=ATTR, kind="method", wrapper=receive_wrapper, params=("self",) + RECEIVE_ARGS,
           when={"mechanism": "layout"}),
)
