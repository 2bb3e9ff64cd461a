"""KV loads on decode: a step's NIXL reads posted when its connector metadata is bound.

Why
    From 0.29 on vLLM posts a step's asynchronous KV loads (the NIXL reads of requests
    that just entered WAITING_FOR_REMOTE_KVS) *after* the step's forward has been
    launched (``start_after_forward`` in the V1 runner's connector context,
    ``post_forward`` in Model Runner V2), to keep the host-side cost of posting off the
    forward's critical path.  With the cross-layer layout posting is cheap (one
    descriptor per block, pairs merged by transfer_order.py), while the read then waits
    for the host side of the forward launch, and is polled only after it.  Part of the P/D
    handoff (issue 22, experiments/README.md "How the numbers are measured").
How
    Under ``XLKV_EARLY_LOAD=1`` (off by default; the ablation config ``shim-early``):
    ``NixlConnector.bind_connector_metadata`` is wrapped on a worker: after the original
    bound the step's metadata, the connector's own ``start_load_kv`` is called at once,
    on the same (worker) thread, with the same metadata, and the metadata object is
    remembered; ``NixlConnector.start_load_kv`` is wrapped to skip the later call vLLM makes
    for that same object.  Every read is posted exactly once, by vLLM's code, earlier in
    the step: the shim writes no transfer itself.  Where the KV cache zeroes newly
    allocated blocks before use (mamba layers, mixed precision: ``needs_kv_cache_zeroing``)
    vLLM's order is kept, because vLLM orders the loads after that zeroing.  Up to 0.28
    vLLM already posts the loads before the forward, so the lever has no target there.
vLLM versions
    0.29+ (the releases whose table row says ``load_start after``).
Removal
    When vLLM posts async loads at scheduling time (upstream RFC #50913, PR #51919,
    ``fast_kv_dispatch``) or the shim's handoff measurements show no gain.
"""

from ..flag import knob
from ..logs import info_once, logger

KNOB = "XLKV_EARLY_LOAD"
#: the metadata object whose loads this connector already posted at bind time
MARK = "_xlkv_loads_started_for"


def enabled(environ=None):
    return knob(KNOB, environ)


def needs_zeroing(connector):
    """True where vLLM zeroes new KV blocks before use (it orders the loads after that)."""
    for owner in (connector, getattr(connector, "connector_worker", None)):
        for name in ("_kv_cache_config", "kv_cache_config"):
            cfg = getattr(owner, name, None)
            if cfg is not None and getattr(cfg, "needs_kv_cache_zeroing", False):
                return True
    return False


def _pending_reads(metadata):
    reqs = getattr(metadata, "reqs_to_recv", None)
    return len(reqs) if reqs else 0


def bind_wrapper(wrapped, instance, args, kwargs):
    """After binding a worker's step metadata, post its loads now (XLKV_EARLY_LOAD=1)."""
    result = wrapped(*args, **kwargs)
    if getattr(instance, "connector_worker", None) is None or not enabled():
        return result
    metadata = getattr(instance, "_connector_metadata", None)
    if metadata is None or getattr(instance, MARK, None) is metadata:
        return result
    if needs_zeroing(instance):
        info_once("early-load-zeroing", "XLKV_EARLY_LOAD=1 left as vLLM orders it: this model's KV cache zeroes new "
                  "blocks before use, and vLLM posts the KV loads after that zeroing")
        return result
    reads = _pending_reads(metadata)
    instance.start_load_kv(None)  # NixlConnector's own (wrapped: it records MARK)
    if reads:
        info_once("early-load", "XLKV_EARLY_LOAD=1: KV loads are posted when the step's connector metadata is "
                  "bound, before the forward launch (first: %d request(s))", reads)
    return result


def start_wrapper(wrapped, instance, args, kwargs):
    """Post the step's loads once: skip vLLM's own call for metadata already started at bind."""
    if not enabled():
        return wrapped(*args, **kwargs)
    metadata = getattr(instance, "_connector_metadata", None)
    if metadata is not None and getattr(instance, MARK, None) is metadata:
        logger.debug("xlkv_autopatch: start_load_kv skipped: this step's loads were posted at bind")
        return None
    result = wrapped(*args, **kwargs)
    if metadata is not None and getattr(instance, "connector_worker", None) is not None:
        setattr(instance, MARK, metadata)
    return result
