"""State the patches share within one process: what each compatibility hash means, which
worker registered the cross-layer layout, and why this engine kept the stock layout.

compat_hash.py and cross_layer_registration.py write it, handshake.py and block_count.py
read it; they import this module, not each other.
"""

import threading

from .. import facts, layout

PER_LAYER = "the stock per-layer KV layout (ENABLE_XLKV unset there, or xlkv fell back to the stock layout)"
XLKV = "xlkv's cross-layer KV layout (ENABLE_XLKV=true)"
#: 0.29+, every model whose KV heads are split over TP ranks: BHLNC rows, each registered as one region
XLKV_HEADS = ("xlkv's heads-outermost KV layout (ENABLE_XLKV=true, xlkv_autopatch 0.7.0 or later: BHLNC block rows, "
              "each registered as one NIXL region)")
#: an xlkv before 0.7.0 on vLLM 0.29+: token-major BLNHC rows at one KV head per rank, each registered as one region
XLKV_ROW = ("xlkv's token-major KV layout at one KV head per tensor-parallel rank, each block's row registered as "
            "one NIXL region (ENABLE_XLKV=true, an xlkv_autopatch before 0.7.0)")
NATIVE = "vLLM's own cross-layer opt-in (enable_cross_layers_blocks) without xlkv"
#: 0.29+ hash no KV layout: a peer without xlkv's tag may run vLLM's own block-outermost layout
UNTAGGED_0_29 = ("no xlkv layout: the stock per-layer KV layout (ENABLE_XLKV unset there, or xlkv fell back to the "
                 "stock layout), or vLLM's own block-outermost layout (VLLM_KV_CACHE_LAYOUT=BLNHC or BHLNC) without "
                 "ENABLE_XLKV, whose bytes match but whose hash vLLM >= 0.29 cannot tell from the stock one")

#: 0.24-0.28: vLLM's packed multi-group layout hashes ``cross_layers_blocks=False``, like the stock layout
UNTAGGED_PACKED = ("no xlkv layout: the stock per-layer KV layout (ENABLE_XLKV unset there, or xlkv fell back to the "
                   "stock layout), or vLLM's own packed multi-group KV layout (enable_cross_layers_blocks) without "
                   "ENABLE_XLKV, whose hash vLLM 0.24-0.28 cannot tell from the stock one")

_lock = threading.Lock()
#: hash -> what a peer publishing it runs
KNOWN = {}
#: why this process kept the stock layout although ENABLE_XLKV is on (fallbacks, explicit layout)
_stock_reasons = []

MARK = "_xlkv_cross_layer"
PACKED_MARK = "_xlkv_packed_groups"


def remember_hashes(stock, cross_layer, native=None, heads_outermost=False):
    """Record the hashes a peer of this model could publish; return the one to publish.

    ``stock`` is the hash without any layout factor (or, 0.16-0.28, with
    ``cross_layers_blocks=False``); ``native`` the 0.16-0.28 hash with the flag True;
    ``heads_outermost``: this worker registers BHLNC rows as one region each (0.29+,
    page_contiguous.py checks it), which a peer registering another layout, or the same one per
    layer, must not pair with; the tag is the same at every KV heads per rank, so that any TP
    pairing of two such engines matches.
    """
    base = native if native is not None else stock
    tagged = layout.tag_hash(base)
    layouts = facts.current().mechanism == "layout"
    with _lock:
        if layouts:
            KNOWN[stock] = UNTAGGED_0_29
        elif packing_now() or KNOWN.get(stock) == UNTAGGED_PACKED:
            KNOWN[stock] = UNTAGGED_PACKED
        else:
            KNOWN[stock] = PER_LAYER
        KNOWN[tagged] = XLKV
        if layouts:
            KNOWN[layout.tag_hash(base, layout.ROW_AT_ONE_KV_HEAD)] = XLKV_ROW
            KNOWN[layout.tag_hash(base, layout.HEADS_OUTERMOST_ROWS)] = XLKV_HEADS
        if native is not None:
            KNOWN[native] = NATIVE
    if cross_layer and heads_outermost:
        return layout.tag_hash(base, layout.HEADS_OUTERMOST_ROWS)
    return tagged if cross_layer else stock


def is_xlkv(description):
    """A hash description that means one of xlkv's cross-layer registrations."""
    return description in (XLKV, XLKV_ROW, XLKV_HEADS)


class _ThreadScope:
    """``with scope:`` marks this thread as inside a registration (nesting counts); ``bool(scope)``
    says whether it is.  The compatibility hash vLLM computes inside the call reads it."""

    def __init__(self):
        self._local = threading.local()

    def __enter__(self):
        self._local.depth = getattr(self._local, "depth", 0) + 1
        return self

    def __exit__(self, *exc):
        self._local.depth -= 1
        return False

    def __bool__(self):
        return getattr(self._local, "depth", 0) > 0


#: around a handshake (add_remote_agent) of a worker whose heads-outermost rows handshake.py lets through
#: vLLM's heterogeneous-TP gate (block_contiguous.py reads it)
_HEAD_SLICING = _ThreadScope()
#: around xlkv's packed multi-group registration (compat_hash.py tags its hash, although vLLM
#: passes ``cross_layers_blocks=False``)
_PACKING = _ThreadScope()

HEADS_MARK = "_xlkv_heads_outermost_rows"


def head_slicing():
    """``with head_slicing():`` around a handshake in which vLLM may slice this worker's heads-outermost
    rows by heads (block_contiguous.py answers its layout test for them)."""
    return _HEAD_SLICING


def head_slicing_now():
    return bool(_HEAD_SLICING)


def mark_heads_outermost(worker, why_not=None):
    """This worker registered BHLNC rows as one region each (page_contiguous.py checked it after
    vLLM's registration); ``why_not``: why its heads do not tile every row (None: they do)."""
    setattr(worker, HEADS_MARK, why_not or True)


def heads_outermost(worker):
    """(the worker registered heads-outermost rows that vLLM may slice by heads, why not where it
    registered BHLNC rows whose heads do not tile them; None where it registered no BHLNC rows)."""
    value = getattr(worker, HEADS_MARK, None)
    return value is True, (None if value is True else value)


#: set on a worker by the receive restage (patches/block_size_restage.py, vLLM 0.29+): it permutes each
#: received heads-outermost row from a peer with smaller blocks into token order before vLLM's own
#: receive post-processing, so that the peer's blocks may be read whole into parts of this worker's rows
RESTAGE_MARK = "_xlkv_restages_rows"


def mark_restages(worker):
    setattr(worker, RESTAGE_MARK, True)


def restages(worker):
    """Does this worker restage received rows (block_size_restage.py attached to it)?"""
    return getattr(worker, RESTAGE_MARK, False) is True


def describe_hash(value):
    return KNOWN.get(value)


def is_untagged(description):
    """A hash description that means "the stock layout, or (0.29+; 0.24-0.28 packed groups) anything
    without xlkv's tag"."""
    return description in (PER_LAYER, UNTAGGED_0_29, UNTAGGED_PACKED)


def note_stock_reason(reason):
    """ENABLE_XLKV is on and this engine keeps the stock layout, for ``reason``."""
    with _lock:
        if reason not in _stock_reasons:
            _stock_reasons.append(reason)


def stock_reasons():
    with _lock:
        return list(_stock_reasons)


#: set when xlkv answered "prefer cross-layer blocks" in this process (0.12-0.28): the model
#: runner of this process then allocates one cross-layer tensor and registers it
_preferred = []


def note_cross_layer_preferred():
    with _lock:
        if not _preferred:
            _preferred.append(True)


def cross_layer_preferred():
    with _lock:
        return bool(_preferred)


def mark_cross_layer(worker):
    """This worker registers xlkv's cross-layer tensor (0.12-0.15 redirect)."""
    setattr(worker, MARK, True)


def mark_packed_groups(worker):
    """This worker registers vLLM's packed multi-group layout that xlkv turned on (0.24-0.28): one
    region across every layer of every KV cache group, cross-layer for the handshake's checks."""
    setattr(worker, MARK, True)
    setattr(worker, PACKED_MARK, True)


def is_packed_groups(worker):
    return bool(getattr(worker, PACKED_MARK, False))


def packing():
    """``with packing():`` the compatibility hash computed in this thread belongs to xlkv's packed
    multi-group registration (compat_hash.py tags it, although vLLM passes ``cross_layers_blocks=False``)."""
    return _PACKING


def packing_now():
    return bool(_PACKING)


def is_cross_layer(worker):
    """Did this worker register a cross-layer layout (xlkv's or, 0.29+, a whole-row KV layout)?"""
    if getattr(worker, MARK, False):
        return True
    for topo_name in ("transfer_topo", "kv_topo"):
        topo = getattr(worker, topo_name, None)
        if topo is not None and getattr(topo, "cross_layers_blocks", False) is True:
            return True
    return facts.current().mechanism == "layout" and getattr(worker, "kv_cache_layout", None) in layout.WHOLE_ROW_LAYOUTS
