"""NIXL handshake: refuse layouts that would move wrong bytes, and say why.

Why
    A handshake between a cross-layer side and a per-layer side must fail with a message
    that names the cause; so must configurations the cross-layer layout cannot serve
    correctly: a different block size on prefill and decode (a cross-layer row cannot be
    re-split into other token ranges) and heterogeneous TP where a block cannot be sliced
    by heads (blocks-first backends, vLLM >= 0.29 whole-row layouts).
How
    ``_nixl_handshake`` is wrapped: vLLM's "NIXL compatibility hash mismatch" error is
    re-raised as XlkvMismatchError naming what each side runs (from the hashes
    compat_hash.py remembered in _state.py), the cause this engine recorded when it kept
    the stock layout (an explicit VLLM_KV_CACHE_LAYOUT, a fallback), the causes possible
    on the remote side, and the fix.  ``add_remote_agent`` (where a peer's
    metadata is first used; vLLM's own block-size and TP arithmetic runs inside it) is
    wrapped to check block size and TP slicing before any of that runs (only where this
    worker registered xlkv's cross-layer layout; a block-size refusal tells a different
    ``--block-size`` from a different attention kernel block), and on 0.12, which has no
    hash, to compare the region layout on either side.  Release differences (hash or
    not, which layouts keep heads outermost) come from facts.py.
vLLM versions
    ``_nixl_handshake`` 0.13-0.33; ``add_remote_agent`` 0.12-0.33 (owner:
    NixlConnectorWorker up to 0.23, NixlBaseConnectorWorker from 0.24).
Removal
    When the layout is part of upstream's handshake checks for every supported release.
"""

import os
import re

from .. import facts, layout
from ..errors import XlkvMismatchError
from . import _state
from ._glue import bind

LOCAL_PER_LAYER = "the stock per-layer KV layout (ENABLE_XLKV unset here, or xlkv kept the stock layout)"

FIX = ("Fix: set ENABLE_XLKV=true on BOTH prefill and decode (or unset it on both), with the same "
       "xlkv_autopatch, vLLM release and connector configuration (a MultiConnector on one side only "
       "can turn cross-layer blocks off there)")

REMOTE_STOCK_CAUSES = (
    "On the remote engine either ENABLE_XLKV is unset, or it is set and that engine kept the stock layout: its log "
    "has an xlkv WARNING or INFO line naming why (an explicit VLLM_KV_CACHE_LAYOUT, which wins over xlkv on vLLM "
    "0.29+; a MultiConnector with a connector that takes no cross-layer blocks; MLA or hybrid models; host-buffer "
    "mode; a smaller attention kernel block)")


def _hash_in(text, label):
    m = re.search(label + r":\s*(\S+)", text)
    return m.group(1).rstrip(".,") if m else None


def _local_cause():
    reasons = _state.stock_reasons()
    env_layout = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    if facts.current().kv_cache_layouts and env_layout and env_layout not in layout.WHOLE_ROW_LAYOUTS:
        # vLLM does not ask the connector for a layout then, so no patch saw it: name it here
        explicit = layout.explicit_layout_reason(env_layout)
        reasons = reasons if explicit in reasons else reasons + [explicit]
    return ("; here: %s" % "; ".join(reasons)) if reasons else ""


def _explain(local, remote):
    """(what this engine runs, what the remote runs, the fix) or None when xlkv cannot tell."""
    ours, theirs = _state.describe_hash(local), _state.describe_hash(remote)
    if theirs is None and remote and local and remote == layout.tag_hash(local):
        # the peer is this very configuration with xlkv's layout; this side kept the stock one
        ours, theirs = LOCAL_PER_LAYER, _state.XLKV
    if theirs is None:
        if remote and remote.startswith(layout.HASH_PREFIX):
            return (ours or LOCAL_PER_LAYER, "xlkv's cross-layer KV layout for another configuration (model, dtype, "
                    "block size, attention backend or vLLM release differ)",
                    "Fix: run the same model, dtype, --block-size, attention backend and vLLM release on both sides")
        return None
    ours = ours or "a configuration xlkv does not recognise"
    if ours == LOCAL_PER_LAYER or ours == _state.PER_LAYER:
        ours = LOCAL_PER_LAYER + _local_cause()
        fix = ("Fix: remove the cause named above on this engine, or set ENABLE_XLKV=true on it, so that both "
               "engines run xlkv's layout (or unset ENABLE_XLKV on both)")
        return ours, theirs, fix
    if theirs == _state.PER_LAYER:
        return ours, theirs + ". " + REMOTE_STOCK_CAUSES, FIX
    return ours, theirs, FIX


def handshake_wrapper(wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    except RuntimeError as err:
        text = str(err)
        if "compatibility hash mismatch" not in text:
            raise
        explained = _explain(getattr(instance, "compat_hash", None) or _hash_in(text, "Local"), _hash_in(text, "Remote"))
        if explained is None:
            raise  # not a layout difference xlkv can name: keep vLLM's message
        ours, theirs, fix = explained
        raise XlkvMismatchError(
            "xlkv_autopatch: NIXL handshake refused: this %s engine runs %s; the remote engine runs %s. %s"
            % (_role(instance), ours, theirs, fix)) from err
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


def _logical_block_size(worker):
    cfg = getattr(getattr(worker, "vllm_config", None), "cache_config", None)
    value = getattr(cfg, "block_size", None)
    return value if isinstance(value, int) else None


def _block_size_refusal(meta, local_bs, remote_bs, logical):
    engine = getattr(meta, "engine_id", "?")
    if logical is not None and logical != local_bs:
        here = "KV blocks of %d tokens (--block-size), split by the attention kernel into %d-token blocks" % (
            logical, local_bs)
    else:
        here = "%d-token KV blocks" % local_bs
    return XlkvMismatchError(
        "xlkv_autopatch: NIXL handshake refused: the remote engine %s registers %s-token blocks with NIXL, this engine "
        "%s. A cross-layer block cannot be re-split into other token ranges. Where --block-size is the same on both "
        "sides, the attention kernel block differs: a different attention backend (or kernel block size) on one "
        "side. Fix: the same --block-size and the same attention backend on prefill and decode, or unset ENABLE_XLKV "
        "on both" % (engine, remote_bs, here))


def validate_wrapper(wrapped, instance, args, kwargs):
    meta, _rank, remote_tp = bind(args, kwargs, "nixl_agent_meta", "remote_tp_rank", "remote_tp_size")
    remote_tp = 1 if remote_tp is None else remote_tp  # the signature's default
    f = facts.current()
    cross = _state.is_cross_layer(instance)
    if cross:
        local_bs = getattr(instance, "block_size", None)
        remote_bs = getattr(meta, "block_size", None)
        if local_bs is not None and remote_bs is not None and local_bs != remote_bs:
            raise _block_size_refusal(meta, local_bs, remote_bs, _logical_block_size(instance))
        local_tp = _local_tp(instance)
        if remote_tp and remote_tp != local_tp:
            ratio = local_tp // remote_tp if local_tp >= remote_tp else -(remote_tp // local_tp)
            heads_outermost = getattr(instance, "backend_name", "") == "FLASH_ATTN" and f.fa_heads_outermost
            decision = layout.heterogeneous_tp_supported(
                cross_layer=True, tp_ratio=ratio, blocks_first=not heads_outermost,
                whole_row_layout=f.kv_cache_layouts)
            if not decision.use:
                raise XlkvMismatchError(
                    "xlkv_autopatch: NIXL handshake refused: prefill TP %s, decode TP %s: %s. Fix: use the same "
                    "tensor-parallel size on both, or unset ENABLE_XLKV on both" % (remote_tp, local_tp,
                                                                                    decision.reason))
    if not f.has_compat_hash:  # 0.12: compare the region layout directly, on both sides
        remote_regions = len(getattr(meta, "kv_caches_base_addr", []) or [])
        local_regions = len(getattr(instance, "block_len_per_layer", []) or [])
        if remote_regions != local_regions:
            if cross:
                raise XlkvMismatchError(
                    "xlkv_autopatch: NIXL handshake refused: this engine registered %d cross-layer region(s) (%s), "
                    "the remote engine %d per-layer regions (the stock layout: ENABLE_XLKV unset there). %s"
                    % (local_regions, _state.XLKV, remote_regions, FIX))
            raise XlkvMismatchError(
                "xlkv_autopatch: NIXL handshake refused: this engine registered %d per-layer regions (%s%s), the "
                "remote engine %d region(s) (xlkv's cross-layer layout, or another model). %s"
                % (local_regions, LOCAL_PER_LAYER, _local_cause(), remote_regions, FIX))
    return wrapped(*args, **kwargs)
