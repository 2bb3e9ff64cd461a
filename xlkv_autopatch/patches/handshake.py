"""NIXL handshake: refuse layouts that would move wrong bytes, and say why.

Why
    A handshake between a cross-layer side and a per-layer side must fail with a message
    that names the cause; so must configurations the cross-layer layout cannot serve
    correctly: a different block size on prefill and decode (a cross-layer row cannot be
    re-split into other token ranges) and heterogeneous TP where a block cannot be sliced
    by heads (blocks-first backends, vLLM >= 0.29 whole-row layouts).
How
    ``_nixl_handshake`` is wrapped: vLLM's "NIXL compatibility hash mismatch" error is
    re-raised as XlkvMismatchError naming what the remote runs (from the hashes
    compat_hash.py remembered) and the fix.  ``add_remote_agent`` (where a peer's
    metadata is first used; vLLM's own block-size and TP arithmetic runs inside it) is
    wrapped to check block size and TP slicing before any of that runs (only where this
    worker registered xlkv's cross-layer layout), and on 0.12, which has no hash, to
    compare the region layout on either side.
vLLM versions
    ``_nixl_handshake`` 0.13-0.33; ``add_remote_agent`` 0.12-0.33 (owner:
    NixlConnectorWorker up to 0.23, NixlBaseConnectorWorker from 0.24).
Removal
    When the layout is part of upstream's handshake checks for every supported release.
"""

import re

from .. import layout
from ..errors import XlkvMismatchError
from ._glue import bind, release
from .compat_hash import KNOWN, XLKV

LOCAL_PER_LAYER = ("the stock per-layer KV layout (ENABLE_XLKV unset here, or xlkv kept the stock layout: see this "
                   "engine's WARNING)")

FIX = ("Fix: set ENABLE_XLKV=true on BOTH prefill and decode (or unset it on both), with the same "
       "xlkv_autopatch, vLLM release and connector configuration (a MultiConnector on one side only "
       "can turn cross-layer blocks off there)")


def handshake_wrapper(wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    except RuntimeError as err:
        text = str(err)
        if "compatibility hash mismatch" not in text:
            raise
        remote = re.search(r"Remote:\s*([0-9a-fA-F]+)", text)
        remote = remote.group(1) if remote else None
        local = getattr(instance, "compat_hash", None)
        theirs = KNOWN.get(remote) if remote else None
        ours = KNOWN.get(local, "a configuration xlkv does not recognise")
        if theirs is None and remote and local and remote == layout.tag_hash(local):
            # the peer is this very configuration with xlkv's layout, and this side kept the stock
            # one (ENABLE_XLKV unset here, or a fallback such as a MultiConnector with a connector
            # that takes no cross-layer blocks: see this engine's WARNING)
            ours, theirs = LOCAL_PER_LAYER, XLKV
        if theirs is None:
            raise  # not a layout difference xlkv can name: keep vLLM's message
        raise XlkvMismatchError(
            "xlkv_autopatch: NIXL handshake refused: this %s engine runs %s, the remote engine runs %s. %s"
            % (_role(instance), ours, theirs, FIX)) from err


def _role(worker):
    cfg = getattr(worker, "kv_transfer_config", None) or getattr(getattr(worker, "vllm_config", None),
                                                                "kv_transfer_config", None)
    return getattr(cfg, "kv_role", "local") or "local"


def _local_tp(worker):
    for name in ("world_size", "tp_size"):
        value = getattr(worker, name, None)
        if isinstance(value, int):
            return value
    return 1


def is_cross_layer(worker, rel=None):
    """Did this worker register xlkv's cross-layer layout?  (``rel``: release(), if known.)"""
    if getattr(worker, "_xlkv_cross_layer", False):
        return True
    for topo_name in ("transfer_topo", "kv_topo"):
        topo = getattr(worker, topo_name, None)
        if topo is not None and getattr(topo, "cross_layers_blocks", False):
            return True
    kv_layout = getattr(worker, "kv_cache_layout", None)
    return (rel or release()) >= (0, 29, 0) and kv_layout in layout.WHOLE_ROW_LAYOUTS


def validate_wrapper(wrapped, instance, args, kwargs):
    meta, _rank, remote_tp = bind(args, kwargs, "nixl_agent_meta", "remote_tp_rank", "remote_tp_size")
    remote_tp = 1 if remote_tp is None else remote_tp  # the signature's default
    rel = release()
    cross = is_cross_layer(instance, rel)
    if cross:
        local_bs = getattr(instance, "block_size", None)
        remote_bs = getattr(meta, "block_size", None)
        if local_bs is not None and remote_bs is not None and local_bs != remote_bs:
            raise XlkvMismatchError(
                "xlkv_autopatch: NIXL handshake refused: remote engine %s uses KV block size %s, this engine %s. "
                "A cross-layer block cannot be re-split into other token ranges. Fix: use the same --block-size "
                "on prefill and decode, or unset ENABLE_XLKV on both" % (getattr(meta, "engine_id", "?"),
                                                                         remote_bs, local_bs))
        local_tp = _local_tp(instance)
        if remote_tp and remote_tp != local_tp:
            ratio = local_tp // remote_tp if local_tp >= remote_tp else -(remote_tp // local_tp)
            backend = getattr(instance, "backend_name", "")
            # FlashAttention cross-layer blocks keep heads outermost ((blocks, heads, layers, 2, tokens,
            # dim) up to 0.22, (blocks, heads, layers, tokens, 2*dim) in 0.26-0.28); 0.23-0.25 treat
            # FA as blocks-first in the transfer arithmetic, and FlashInfer/Triton are blocks-first.
            heads_outermost = backend == "FLASH_ATTN" and (rel < (0, 23, 0) or (0, 26, 0) <= rel < (0, 29, 0))
            decision = layout.heterogeneous_tp_supported(
                cross_layer=True, tp_ratio=ratio, blocks_first=not heads_outermost,
                whole_row_layout=rel >= (0, 29, 0))
            if not decision.use:
                raise XlkvMismatchError(
                    "xlkv_autopatch: NIXL handshake refused: prefill TP %s, decode TP %s: %s. Fix: use the same "
                    "tensor-parallel size on both, or unset ENABLE_XLKV on both" % (remote_tp, local_tp,
                                                                                    decision.reason))
    if rel < (0, 13, 0):  # no compatibility hash: compare the region layout directly, on both sides
        remote_regions = len(getattr(meta, "kv_caches_base_addr", []) or [])
        local_regions = len(getattr(instance, "block_len_per_layer", []) or [])
        if remote_regions != local_regions:
            if cross:
                raise XlkvMismatchError(
                    "xlkv_autopatch: NIXL handshake refused: this engine registered %d cross-layer region(s) (%s), "
                    "the remote engine %d per-layer regions (the stock layout: ENABLE_XLKV unset there). %s"
                    % (local_regions, XLKV, remote_regions, FIX))
            raise XlkvMismatchError(
                "xlkv_autopatch: NIXL handshake refused: this engine registered %d per-layer regions (%s), the remote "
                "engine %d region(s) (xlkv's cross-layer layout, or another model). %s"
                % (local_regions, LOCAL_PER_LAYER, remote_regions, FIX))
    return wrapped(*args, **kwargs)
