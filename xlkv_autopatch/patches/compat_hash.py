"""compute_nixl_compatibility_hash: an xlkv factor, so mismatched peers refuse at handshake.

Why
    A prefill/decode pair where only one side uses the cross-layer layout must never
    transfer: the byte ranges of a block mean different things on the two sides.
    vLLM 0.16-0.28 hash a ``cross_layers_blocks`` flag; 0.13-0.15 and 0.29+ hash nothing
    layout-related (0.29+ catch it later, with a misleading heterogeneous-TP message).
How
    The hash function is wrapped where the worker module looks it up (a module global):
    when the registered layout is xlkv's cross-layer one, the published hash becomes
    ``"xlkv-cross-layer-KV-layout.sent-by-an-engine-with-ENABLE_XLKV=true." +
    sha256(stock_hash | "xlkv-cross-layer-v2")``: vLLM prints the remote hash in its own
    mismatch error, so even a peer without the shim (flag unset there) names the cause.
    One wrapper per hash signature (0.16-0.28 hash a ``cross_layers_blocks`` flag, 0.29+
    the engine's KV layout), chosen by the release table's ``hash`` column (``TARGETS``).  On 0.24-0.28 vLLM's packed
    multi-group registration hashes ``cross_layers_blocks=False`` (the stock hash); where xlkv
    turned that layout on (packed_kv_cache_config.py) the hash computed during the
    registration is tagged all the same.  Every hash a peer could send for this
    model (stock, xlkv, vLLM's own opt-in) is remembered with a description (_state.py), so
    the handshake patch (handshake.py) can say which side is misconfigured.  With the flag
    on but the stock layout kept (MLA, fallback), the stock hash is published: the
    layouts agree and stock peers interoperate.  0.29+: a worker on xlkv's
    heads-outermost ``BHLNC`` layout, whose rows page_contiguous.py checks (and, at one KV head per
    rank, has vLLM register) as one region each, publishes a second tag
    (``layout.HEADS_OUTERMOST_ROWS`` in the digest, same readable prefix), the same at any KV heads
    per rank, so the two sides of any TP pairing match while a peer with another layout (vLLM's
    own BHLNC registered per layer, an xlkv before 0.7.0 on BLNHC) refuses the handshake.
vLLM versions
    0.16+ through this wrapper (0.16-0.19 ``nixl_connector``, 0.20-0.23
    ``nixl.worker``, 0.24+ ``nixl.base_worker``); 0.13-0.15 compute the hash in the worker's
    ``__init__`` and are tagged by cross_layer_registration.py; 0.12 has no hash
    (handshake.py compares region counts instead).
Removal
    When upstream hashes the KV layout for every supported release.
"""

from .. import layout, releases
from ..logs import info_once
from ..specs import NIXL_WORKER_MODULE, FromRow, Target
from . import _state
from ._args import bind


def _publish(stock, cross_layer, native=None, heads_outermost=False):
    published = _state.remember_hashes(stock, cross_layer=cross_layer, native=native, heads_outermost=heads_outermost)
    if cross_layer:
        info_once("hash", "compatibility hash %s tagged as %s%s: peers without ENABLE_XLKV refuse the handshake",
                  (native or stock)[:12], published,
                  " (heads-outermost BHLNC rows, each registered as one region: page_contiguous.py; a peer with "
                  "another layout, or registering per-layer regions, refuses it too)" if heads_outermost else "")
    return published


#: the hash's leading parameters that flag_hash_wrapper binds by name (and sets, for both variants)
FLAG_ARGS = ("vllm_config", "attn_backend_name", "cross_layers_blocks")
#: the one layout_hash_wrapper binds
LAYOUT_ARGS = ("vllm_config",)


def flag_hash_wrapper(wrapped, instance, args, kwargs):
    """0.16-0.28: ``(vllm_config, attn_backend_name, cross_layers_blocks, ...)``."""
    # 0.24-0.28: vLLM's packed multi-group registration passes False; packed_kv_cache_config.py marks the
    # registration that xlkv turned on, so it is tagged like xlkv's cross-layer tensor
    cross = bool(bind(args, kwargs, *FLAG_ARGS)[2]) or _state.packing_now()
    variants = {}
    for flag in (False, True):
        a, k = list(args), dict(kwargs)
        if FLAG_ARGS[2] in k:
            k[FLAG_ARGS[2]] = flag
        else:
            a[2] = flag
        variants[flag] = wrapped(*a, **k)
    return _publish(variants[False], cross_layer=cross, native=variants[True])


def layout_hash_wrapper(wrapped, instance, args, kwargs):
    """0.29+: ``(vllm_config, attn_backend_name, transfer_mode)``; the layout is the engine's."""
    (vllm_config,) = bind(args, kwargs, *LAYOUT_ARGS)
    stock = wrapped(*args, **kwargs)
    resolved = vllm_config.cache_config.get_resolved_kv_cache_layout().name
    return _publish(stock, cross_layer=resolved in layout.WHOLE_ROW_LAYOUTS,
                    heads_outermost=resolved == layout.HEADS_OUTERMOST_LAYOUT)


#: hash signatures (releases.HASH_PARAMS) with a cross_layers_blocks flag, and the others
FLAG_HASHES = tuple(name for name, params in releases.HASH_PARAMS.items() if FLAG_ARGS[2] in params)
LAYOUT_HASHES = tuple(name for name in releases.HASH_PARAMS if name not in FLAG_HASHES)

#: what this file wraps: compute_nixl_compatibility_hash where the release has it as a module function of
#: its NIXL worker module (the release table's ``hash`` column, whose parameters are checked before patching)
_ON_WORKER_MODULE = dict(group="nixl", module=NIXL_WORKER_MODULE, owner=None, attr="compute_nixl_compatibility_hash",
                         kind="function", params=FromRow("hash_params"))
TARGETS = (
    Target(name="compat_hash.tag", wrapper=flag_hash_wrapper, when={"hash": FLAG_HASHES}, **_ON_WORKER_MODULE),
    Target(name="compat_hash.tag", wrapper=layout_hash_wrapper, when={"hash": LAYOUT_HASHES}, **_ON_WORKER_MODULE),
)
