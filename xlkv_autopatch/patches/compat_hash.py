"""compute_nixl_compatibility_hash: an xlkv factor, so mismatched peers refuse at handshake.

Why
    A prefill/decode pair where only one side uses the cross-layer layout must never
    transfer: the byte ranges of a block mean different things on the two sides.
    vLLM 0.16-0.28 hash a ``cross_layers_blocks`` flag; 0.13-0.15 and 0.29+ hash nothing
    layout-related (0.29+ catch it later, with a misleading heterogeneous-TP message).
How
    The hash function is wrapped where the worker module looks it up (a module global):
    when the registered layout is xlkv's cross-layer one, the published hash becomes
    ``sha256(stock_hash | "xlkv-cross-layer-v1")``.  Every hash a peer could send for this
    model (stock, xlkv, vLLM's own opt-in) is remembered with a description, so the
    handshake patch (handshake.py) can say which side is misconfigured.  With the flag
    on but the stock layout kept (MLA, fallback), the stock hash is published: the
    layouts agree and stock peers interoperate.
vLLM versions
    0.16-0.33 through this wrapper (0.16-0.19 ``nixl_connector``, 0.20-0.23
    ``nixl.worker``, 0.24+ ``nixl.base_worker``); 0.13-0.15 compute the hash in the worker's
    ``__init__`` and are tagged by cross_layer_registration.py; 0.12 has no hash
    (handshake.py compares region counts instead).
Removal
    When upstream hashes the KV layout for every supported release.
"""

import threading

from .. import layout
from ._glue import bind, info_once, release

_lock = threading.Lock()
#: hash -> what a peer publishing it runs
KNOWN = {}


PER_LAYER = "the stock per-layer KV layout (ENABLE_XLKV unset there, or xlkv fell back to the stock layout)"
XLKV = "xlkv's cross-layer KV layout (ENABLE_XLKV=true)"
NATIVE = "vLLM's own cross-layer opt-in (enable_cross_layers_blocks) without xlkv"


def remember_hashes(stock, cross_layer, native=None):
    """Record the hashes a peer of this model could publish; return the one to publish.

    ``stock`` is the hash without any layout factor (or, 0.16-0.28, with
    ``cross_layers_blocks=False``); ``native`` the 0.16-0.28 hash with the flag True.
    """
    base = native if native is not None else stock
    tagged = layout.tag_hash(base)
    with _lock:
        KNOWN[stock] = PER_LAYER
        KNOWN[tagged] = XLKV
        if native is not None:
            KNOWN[native] = NATIVE
    if cross_layer:
        info_once("hash", "compatibility hash %s tagged as %s: peers without ENABLE_XLKV refuse the handshake",
                  base[:12], tagged[:12])
        return tagged
    return stock


def hash_wrapper(wrapped, instance, args, kwargs):
    rel = release()
    if rel < (0, 29, 0):  # (vllm_config, attn_backend_name, cross_layers_blocks, ...)
        cross = bool(bind(args, kwargs, "vllm_config", "attn_backend_name", "cross_layers_blocks")[2])
        variants = {}
        for flag in (False, True):
            a, k = list(args), dict(kwargs)
            if "cross_layers_blocks" in k:
                k["cross_layers_blocks"] = flag
            else:
                a[2] = flag
            variants[flag] = wrapped(*a, **k)
        return remember_hashes(variants[False], cross_layer=cross, native=variants[True])
    (vllm_config,) = bind(args, kwargs, "vllm_config")
    stock = wrapped(*args, **kwargs)
    resolved = vllm_config.cache_config.get_resolved_kv_cache_layout().name
    return remember_hashes(stock, cross_layer=resolved in layout.WHOLE_ROW_LAYOUTS)
