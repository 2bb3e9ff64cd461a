"""NIXL transfers of a worker under ENABLE_XLKV: descriptor pairs in ascending local order.

Why
    NIXL merges consecutive descriptors of one transfer into one only where the local *and*
    the remote address continue the previous one in list order, and vLLM lists a request's
    blocks in allocation order, which its free queue makes descending once requests have come
    and gone (blocks are freed in reverse).  With one descriptor per block (the cross-layer
    layout) a request's transfer can still cost one NIXL descriptor per block: on 2xH200 with
    vLLM 0.26 D's KV metrics showed 280-417 descriptors per 640-block transfer under load.
    Workers that keep vLLM's per-layer regions (sparse-indexer MLA, Mamba hybrids, one KV
    head per rank on 0.29+, every fallback) pay it once per region: 8 descending blocks of a
    4-layer model are 32 descriptors where ascending ones merge to 4.
How
    After ``register_kv_caches`` (block_count.py calls :func:`attach` for every worker of an
    engine with ENABLE_XLKV, whatever layout it registered), the worker's own NIXL agent
    object gets a wrapper on its ``make_prepped_xfer``: the (local, remote) descriptor-id
    pairs are permuted together into ascending local order
    (:func:`xlkv_autopatch.layout.ascending_order`) and the original is called.  Pairs are
    independent copies, so the same bytes move; runs that are contiguous in the same
    direction on both sides become one descriptor.  vLLM numbers a per-layer descriptor
    ``region * blocks + block``, so ascending local order is region by region, blocks
    ascending inside each: every region's runs merge.  READ (pull) and WRITE (push, 0.24+) go
    through the same call; heterogeneous TP, prefix-cache hits and several KV groups only
    change which pairs vLLM lists, never their meaning.  Only this worker's agent is wrapped
    (not NIXL's class); a call with ``skip_desc_merge=True`` and ``XLKV_COALESCE=false`` are
    left as vLLM makes them.
vLLM versions
    0.12+.
Removal
    When vLLM (or NIXL) orders a transfer's descriptors itself before merging.
"""

import functools

from .. import layout
from ..flag import knob
from ..logs import info_once, logger, once
from ..specs import Attached

KNOB = "XLKV_COALESCE"
MARK = "_xlkv_transfer_order"
#: nixl_agent.make_prepped_xfer(operation, local_xfer_side, local_indices, remote_xfer_side,
#: remote_indices, notif_msg=b"", backends=[], skip_desc_merge=False)
LOCAL, REMOTE = 2, 4


def enabled(environ=None):
    """XLKV_COALESCE through the shim's one knob parser (:func:`xlkv_autopatch.flag.knob`):
    unset/empty is on; an unrecognised value raises XlkvFlagError naming it (with
    ENABLE_XLKV on, start-up already refused it)."""
    return knob(KNOB, environ)


def _take(ids, order):
    if hasattr(ids, "take"):  # numpy, as vLLM passes
        return ids.take(order)
    return [ids[i] for i in order]


def reorder(args, kwargs):
    """(args, kwargs) of one make_prepped_xfer call with the pairs in ascending local order."""
    if kwargs.get("skip_desc_merge"):
        return args, kwargs
    args = list(args)
    def get(pos, name):
        return args[pos] if len(args) > pos else kwargs.get(name)
    local, remote = get(LOCAL, "local_indices"), get(REMOTE, "remote_indices")
    if local is None or remote is None or len(local) != len(remote):
        return tuple(args), kwargs  # not the shape this patch knows: untouched, NIXL decides
    order = layout.ascending_order(local)
    if order is None:
        return tuple(args), kwargs
    new = {}
    for pos, name, ids in ((LOCAL, "local_indices", local), (REMOTE, "remote_indices", remote)):
        new[name] = _take(ids, order)
        if len(args) > pos:
            args[pos] = new[name]
        else:
            kwargs = dict(kwargs, **{name: new[name]})
    if once("transfer_order_first"):  # what the first reordered transfer gained, once per process
        logger.info("xlkv_autopatch: first reordered NIXL transfer: %d descriptor pairs, %d contiguous runs in "
                    "vLLM's order, %d after ordering", len(local), layout.merged_descriptor_count(local, remote),
                    layout.merged_descriptor_count(new["local_indices"], new["remote_indices"]))
    return tuple(args), kwargs


def attach(worker):
    """Wrap ``worker.nixl_wrapper.make_prepped_xfer`` (once); called for every worker under the flag."""
    agent = getattr(worker, "nixl_wrapper", None)
    original = getattr(agent, "make_prepped_xfer", None)
    if original is None or getattr(original, MARK, False):
        return
    if not enabled():
        info_once("transfer_order_off", "%s=false: NIXL transfers keep vLLM's descriptor order", KNOB)
        return

    @functools.wraps(original)
    def make_prepped_xfer(*args, **kwargs):
        try:
            new_args, new_kwargs = reorder(args, kwargs)
        except Exception as e:  # noqa: BLE001 - an order we cannot compute: vLLM's own order
            if once(("transfer_order_error", type(e).__name__)):
                logger.warning("xlkv_autopatch: could not order a NIXL transfer's descriptors (%s: %s); "
                               "this and similar transfers keep vLLM's order", type(e).__name__, e)
            new_args, new_kwargs = args, kwargs
        return original(*new_args, **new_kwargs)

    setattr(make_prepped_xfer, MARK, True)
    agent.make_prepped_xfer = make_prepped_xfer
    info_once("transfer_order", "NIXL transfers list their descriptor pairs in ascending local order, so runs "
                                "contiguous on both sides merge (%s=false turns this off)", KNOB)


#: what this file wraps: no class attribute, but each worker's NIXL agent method, which block_count's
#: registration wrapper attaches (so its releases are that target's)
ATTACHED = (Attached(attr="make_prepped_xfer", what="nixl_wrapper.make_prepped_xfer (per worker)",
                     by="block_count.register_kv_caches"),)
