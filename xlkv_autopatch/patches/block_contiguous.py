"""KVCacheLayout.is_block_contiguous: let heads-outermost rows through vLLM's heterogeneous-TP gate (vLLM 0.29+).

Why
    With a different TP size on prefill and decode, vLLM's NIXL worker reads each remote rank's
    head slice of a block: at ``offset = head slot x local block length``, ``local block length /
    sources`` bytes long (0.33.0 ``nixl/base_worker.py`` ``_build_fa_remote`` :2196-2246,
    ``_build_local_splits_from_plan`` :280-340; ``tp_mapping.py`` :70-175).  Before that it stops
    every layout that is not ``is_block_contiguous`` (the last three physical dimensions H, N, C:
    LBHNC and BLHNC; 0.33.0 :2831-2844, 0.29.0 :1951-1961, 0.31.0 :2592-2602): "Heterogeneous TP
    head-dimension splitting requires contiguous heads".  That test stands in for what the
    arithmetic needs, the heads outermost inside each registered block region.  xlkv's ``BHLNC``
    rows (``[B, H, L, N, C]``, registered as one region per block: page_contiguous.py) meet it:
    a rank's heads are one range of the row, so the slice is exact and costs 1 descriptor per block
    per remote rank, where stock LBHNC costs one per layer.  The token-major ``BLNHC`` rows do not
    meet it, and stay refused.
How
    The property's getter is wrapped: it answers vLLM's own value, except inside
    ``_state.head_slicing()`` (a thread scope that handshake.py opens around ``add_remote_agent``
    only for a worker whose ``BHLNC`` rows page_contiguous.py checked: one region per block, the
    heads tiling each row with no padding), where ``BHLNC`` answers True.  Nothing else changes:
    the same-layout check before the gate (:2793-2814) still requires ``BHLNC`` on the peer, and
    vLLM's per-region block-length checks after it (:2903-2946: a split region's length must scale
    with the per-rank heads) and its P TP > D TP rules (:2727-2730, :2940-2943) still run.  Other
    threads, and this thread outside the scope, see vLLM's answer (the receive post-processing
    reads the property at :3113, only for different block sizes, which xlkv refuses).
vLLM versions
    0.29+ (``vllm.v1.kv_cache_layout.KVCacheLayout``; the gate is the same test on 0.29.0, 0.31.0
    and 0.33.0, read from their wheels; 0.30.0 and 0.32.0 not read).
Removal
    When vLLM's gate asks whether the registered region keeps the heads outermost (a whole-row
    ``BHLNC`` region does) instead of ``is_block_contiguous``.
"""

from .. import layout
from ..specs import Target
from . import _state

#: vLLM 0.29+'s KV-cache layout enum (KVCacheLayout), whose head-slicing test this file wraps
KV_CACHE_LAYOUT = "vllm.v1.kv_cache_layout"


def contiguous_wrapper(wrapped, instance, args, kwargs):
    answer = wrapped(*args, **kwargs)
    if answer or not _state.head_slicing_now():
        return answer
    return getattr(instance, "name", None) == layout.HEADS_OUTERMOST_LAYOUT


#: what this file wraps: KVCacheLayout.is_block_contiguous, on the KV-cache-layout releases (the release
#: table's ``mechanism``), with their NIXL patch set
TARGETS = (
    Target(name="block_contiguous.heads_outermost", group="nixl", module=KV_CACHE_LAYOUT, owner="KVCacheLayout",
           attr="is_block_contiguous", kind="property", wrapper=contiguous_wrapper, when={"mechanism": "layout"}),
)
