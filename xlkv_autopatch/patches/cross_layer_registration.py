"""NixlConnector.register_cross_layers_kv_cache: register the one cross-layer tensor with NIXL.

Why
    In vLLM 0.12-0.15 the V1 model runner can allocate a cross-layer KV tensor and hands
    it to ``connector.register_cross_layers_kv_cache(tensor, backend)``, but NixlConnector
    inherits the base class's no-op: forcing the allocation alone would register NOTHING
    with NIXL and every transfer would fail (or worse).
How
    After the (no-op) original, the wrapper calls the worker's own
    ``register_kv_caches`` with the tensor presented so that the worker's per-layer
    arithmetic yields one region per block: a zero-copy 4-D view whose dim 0 is the
    kernel-block count and whose ``block_size_position`` dim is the kernel block size
    (inferred from the element count and checked against the backend's own KV shape),
    wrapped in a one-element list when the worker splits K and V (FlashAttention), so
    it iterates exactly one region.  Blocks-first backends (FlashInfer) get the bare
    view; the worker's K/V halving then yields K-all and V-all halves of each block.
    The compatibility hash (0.13-0.15, computed in ``__init__``) is tagged before
    registration builds the handshake payload, so a peer without the shim refuses.
vLLM versions
    0.12-0.15 (0.16+ has NIXL's own override).
Removal
    With 0.12-0.15 support.
"""

from .. import layout
from ..errors import XlkvRegistrationError
from ..logs import info_once
from ..specs import NIXL_CONNECTOR_MODULE, Target
from . import _state
from ._args import bind
from ._config import spec_names

#: register_cross_layers_kv_cache's parameters after self, bound by name
REDIRECT_ARGS = ("kv_cache", "attn_backend")


def _num_layers(connector, worker):
    names, _, _ = spec_names(getattr(connector, "_kv_cache_config", None))
    if names:
        return len(names), names[0]
    cfg = worker.vllm_config
    return cfg.model_config.get_num_layers(cfg.parallel_config), None


def redirect_wrapper(wrapped, instance, args, kwargs):
    kv_cache, attn_backend = bind(args, kwargs, *REDIRECT_ARGS)
    wrapped(*args, **kwargs)  # the base class's no-op, kept in the call chain
    worker = instance.connector_worker
    if worker is None:
        return None
    cfg = worker.vllm_config
    num_layers, first_name = _num_layers(instance, worker)
    heads = cfg.model_config.get_num_kv_heads(cfg.parallel_config)
    head_size = cfg.model_config.get_head_size()
    num_blocks = kv_cache.shape[0]
    kernel_bs = layout.infer_kernel_block_size(kv_cache.numel(), num_blocks, num_layers, heads, head_size)
    per_layer = 1
    for d in attn_backend.get_kv_cache_shape(num_blocks, kernel_bs, heads, head_size):
        per_layer *= d
    if per_layer * num_layers != kv_cache.numel():
        raise XlkvRegistrationError(
            "xlkv_autopatch: cross-layer tensor %s does not match %d layers of %s KV shape for %d blocks "
            "of %d tokens" % (tuple(kv_cache.shape), num_layers, attn_backend.get_name(), num_blocks, kernel_bs))
    if not kv_cache.is_contiguous():
        raise XlkvRegistrationError("xlkv_autopatch: the cross-layer KV tensor is not contiguous; refusing to register a copy")
    if worker.device_type == "cpu" or worker.use_mla:
        position = -2
    else:
        position = -3
    view = kv_cache.view(layout.registration_view_shape(kv_cache.numel(), num_blocks, kernel_bs, position))
    value = [view] if worker.kv_topo.split_k_and_v else view
    if getattr(worker, "compat_hash", None) is not None:  # 0.13-0.15: tag before the payload is built
        worker.compat_hash = _state.remember_hashes(worker.compat_hash, cross_layer=True)
    _state.mark_cross_layer(worker)
    info_once("register-xl", "registering one cross-layer KV tensor %s (%d layers, %d blocks of %d tokens, "
              "%d bytes per block) with NIXL", tuple(kv_cache.shape), num_layers, num_blocks, kernel_bs,
              kv_cache.numel() * kv_cache.element_size() // num_blocks)
    return worker.register_kv_caches({first_name or "xlkv.cross_layers": value})


#: what this file wraps: NixlConnector's (inherited, no-op) register_cross_layers_kv_cache, overridden on
#: NixlConnector itself, on the backport releases (the release table's ``mechanism``)
TARGETS = (
    Target(name="cross_layer_registration.redirect", group="nixl", module=NIXL_CONNECTOR_MODULE, owner="NixlConnector",
           attr="register_cross_layers_kv_cache", kind="method", wrapper=redirect_wrapper,
           params=("self",) + REDIRECT_ARGS, on_named_class=True, when={"mechanism": "backport"}),
)
