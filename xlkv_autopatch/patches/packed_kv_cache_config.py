"""kv_cache_utils._use_packed_kv_cache_config: vLLM's packed multi-group KV allocation for sliding-window hybrids.

Why
    Sliding-window + full attention models (gpt-oss, Gemma 3) have several KV cache groups, so
    vLLM's one cross-layer KV tensor (cross_layer_preference.py) never applies to them: stock
    NIXL registers one region per shared layer tensor, 18 descriptors per block id for
    gpt-oss-120b, 10 for Gemma-3-27B.  vLLM 0.24-0.28 have a packed allocation for several
    groups (each block id's row holds every layer's page of every group, one NIXL region: 1
    descriptor per block id), but turn it on only when the user sets
    ``kv_connector_extra_config={"enable_cross_layers_blocks": "true"}``, and the planner reads
    that from the config itself, so answering the connector's property is not enough.  vLLM's
    packed registration hashes ``cross_layers_blocks=False`` (the stock hash) and cannot slice
    heads for another TP size, so (shim 0.8.0) the shim packs only where
    XLKV_EQUAL_TP=true says every peer runs this engine's TP size; otherwise the family decision
    (families.decide) keeps the stock layout with an INFO line and any TP pairing is served.
How
    ``_use_packed_kv_cache_config(vllm_config, kv_cache_groups)`` is wrapped where the planner
    looks it up (its module global).  The original answers first; where it says no, ENABLE_XLKV
    is on, the engine runs NIXL connectors only (plain, or alone in a MultiConnector, so that both
    sides of a pair decide alike), there is more than one KV cache group and the
    model's family decision (families.decide via _model.py) is the packed layout (a
    sliding-window hybrid), the answer is True (INFO line once).  An explicit
    ``enable_cross_layers_blocks=false``, a MultiConnector with another connector in it (the
    packing changes every connector's tensors) and host-buffer mode (vLLM's packed registration bypasses the host
    buffer) keep the stock layout with one WARNING (XLKV_STRICT=1: an error).  On the worker,
    ``_register_packed_kv_cache`` is wrapped: where the family decision is the packed layout,
    the worker is marked cross-layer and packed (handshake.py then refuses another block size
    and heterogeneous TP with the cause) and the compatibility hash computed during the
    registration is tagged like xlkv's cross-layer tensor (compat_hash.py), so a peer without
    the flag (stock, or vLLM's own opt-in) is refused at the handshake with the cause.
vLLM versions
    0.24-0.28 (the release table's ``packed_groups`` column: the planner function and
    ``NixlBaseConnectorWorker._register_packed_kv_cache``); 0.12-0.23 have no packed
    allocation (sliding-window hybrids keep the stock layout with a WARNING naming the family
    where vLLM plans several groups); 0.29+ use block-outermost KV-cache layouts
    (kv_cache_layout.py).
Removal
    With 0.24-0.28 support, or when vLLM packs several KV cache groups for NIXL by default and
    hashes the packing.
"""

from .. import families
from ..logs import info_once
from ..specs import NIXL_WORKER_CLASS, NIXL_WORKER_MODULE, Target
from . import _model, _state
from ._args import bind
from ._config import other_connectors, uses_nixl
from ._fallback import fallback

OPT_IN = "enable_cross_layers_blocks"
#: vLLM's KV cache planner (engine core), home of _use_packed_kv_cache_config on 0.24-0.28
KV_CACHE_UTILS = "vllm.v1.core.kv_cache_utils"
#: _use_packed_kv_cache_config's parameters, bound by name
PREDICATE_ARGS = ("vllm_config", "kv_cache_groups")


def _sliding_window_packs(vllm_config, groups):
    """The family decision for this engine says: vLLM's packed multi-group layout (None: it does not)."""
    if not isinstance(groups, int) or groups < 2:
        return None
    model = _model.decision(vllm_config, kv_cache_groups=groups)
    if model is None or model.family != families.SLIDING_WINDOW or not model.cross_layer:
        return None
    return model


def exclusion(vllm_config):
    """Why a configuration that the family decision would pack keeps the stock layout (None: packs)."""
    kvt = getattr(vllm_config, "kv_transfer_config", None)
    explicit = (getattr(kvt, "kv_connector_extra_config", None) or {}).get(OPT_IN)
    if explicit is not None and str(explicit).strip().lower() != "true":
        return "kv_connector_extra_config sets %s=%s" % (OPT_IN, explicit)
    others = other_connectors(kvt)
    if others:
        return ("a MultiConnector with %s beside its NixlConnector: vLLM's packed multi-group KV layout changes the "
                "KV tensors of every connector in it, so xlkv turns it on for NIXL connectors only" % ", ".join(others))
    device = getattr(getattr(vllm_config, "device_config", None), "device_type", None)
    if getattr(kvt, "kv_buffer_device", None) == "cpu" and device not in (None, "cpu"):
        return "host-buffer mode (kv_buffer_device=cpu): vLLM's packed multi-group registration bypasses the host buffer"
    return None


def predicate_wrapper(wrapped, instance, args, kwargs):
    """The planner's question "pack these KV cache groups into one row per block?"."""
    result = wrapped(*args, **kwargs)
    if result:  # vLLM's own answer (DeepSeek-V4 specs, the user's opt-in)
        return result
    vllm_config, groups = bind(args, kwargs, *PREDICATE_ARGS)
    if not uses_nixl(getattr(vllm_config, "kv_transfer_config", None)):
        return result  # not a NIXL engine: none of xlkv's business
    model = _sliding_window_packs(vllm_config, len(groups) if isinstance(groups, (list, tuple)) else None)
    if model is None:
        return result
    why = exclusion(vllm_config)
    if why is not None:
        fallback("packed-" + why.split(":")[0], "%s (%s)" % (why, model.title))
        return result
    info_once("packed", "packing %d KV cache groups into one row per block id (vLLM's packed multi-group KV "
              "allocation, as enable_cross_layers_blocks would): %s", len(groups), model.reason)
    return True


def register_wrapper(wrapped, instance, args, kwargs):
    """The worker registers a packed KV cache: mark it and tag the hash where xlkv's decision packs it."""
    config = getattr(instance, "vllm_config", None)
    groups = _model.kv_cache_group_count(getattr(instance, "kv_cache_config", None))
    if _sliding_window_packs(config, groups) is None:
        return wrapped(*args, **kwargs)
    _state.mark_packed_groups(instance)
    with _state.packing():
        return wrapped(*args, **kwargs)


#: what this file wraps where the release has vLLM's packed multi-group allocation (the release table's
#: ``packed_groups``): the planner's predicate (its own patch set, on import of the planner: engine core, not NIXL
#: connector code) and the NIXL worker's packed registration (the release's NIXL patch set)
TARGETS = (
    Target(name="packed_kv_cache_config.register", group="nixl", module=NIXL_WORKER_MODULE, owner=NIXL_WORKER_CLASS,
           attr="_register_packed_kv_cache", kind="method", wrapper=register_wrapper, params=("self", "..."),
           when={"packed_groups": True}),
    Target(name="packed_kv_cache_config.plan", group="packed", module=KV_CACHE_UTILS, owner=None,
           attr="_use_packed_kv_cache_config", kind="function", wrapper=predicate_wrapper, params=PREDICATE_ARGS,
           when={"packed_groups": True}),
)
