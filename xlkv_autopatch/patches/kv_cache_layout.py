"""NixlConnector.get_required_kvcache_layout: ask vLLM >= 0.29 for a block-outermost KV layout.

Why
    vLLM 0.29 replaced cross-layer blocks by KV-cache layouts: all layers of a group
    live in one buffer whose dimension order is chosen once in the engine core.
    NixlConnector asks for ``LBHNC`` (layer outermost), so every block still costs one
    NIXL descriptor per layer.  With ``BLNHC`` the block is the outermost dimension, the
    per-layer pages of a block are one contiguous row, and NIXL registers one whole-row
    region: one descriptor per block.
How
    The classmethod is wrapped on the class that defines it (NixlBaseConnector, inherited
    by the pull/push connectors and the ``NixlConnector`` alias): when the original asks
    for a layout (non-MLA models) the wrapper asks for ``BLNHC`` instead.  vLLM still
    validates the preference against the attention backends' supported layouts and falls
    back (with its own warning) where it is not allowed, e.g. FlashInfer on SM100; the
    hash patch then publishes the stock hash, since the layout really is stock.  An
    explicit ``VLLM_KV_CACHE_LAYOUT`` always wins (vLLM never asks the connector then);
    the wrapper logs that once.  MLA models (NixlConnector asks for no layout), host-buffer
    mode, hybrid models, one KV head per tensor-parallel rank (vLLM registers a block-outermost
    layout as one region per layer then: as many descriptors as stock, and consecutive blocks
    no longer merge) and a kernel block smaller than the KV block (vLLM's own
    ``select_common_block_size`` for the engine's attention backends; vLLM cannot register
    such a block-outermost layout) keep the stock layout with one WARNING (XLKV_STRICT=1: an
    error).
vLLM versions
    0.29+.
Removal
    When NixlConnector itself prefers a block-outermost layout.
"""

import os

from .. import layout
from ..logs import info_once
from . import _state
from ._args import bind
from ._fallback import fallback


def _exclusion(vllm_config):
    """Configurations that keep the stock layout (host-buffer copies, hybrid models)."""
    kvt = getattr(vllm_config, "kv_transfer_config", None)
    if getattr(kvt, "kv_buffer_device", None) == "cpu":
        from vllm.platforms import current_platform

        if current_platform.device_type != "cpu":
            return "host-buffer mode (kv_buffer_device=cpu) copies per layer"
    model = getattr(vllm_config, "model_config", None)
    if model is not None and getattr(model, "is_hybrid", False):
        return "hybrid (Mamba/SSM + attention) models keep the stock layout"
    gain = layout.block_outermost_gain(_kv_heads_per_rank(vllm_config))
    if not gain.use:
        return gain.reason
    return _kernel_split(vllm_config)


def _kv_heads_per_rank(vllm_config):
    """KV heads each tensor-parallel rank holds (vLLM's own ModelConfig.get_num_kv_heads)."""
    model = getattr(vllm_config, "model_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    try:
        heads = model.get_num_kv_heads(parallel)
    except Exception:
        return None
    return heads if isinstance(heads, int) else None


def _kernel_split(vllm_config):
    """A kernel block smaller than the KV block: vLLM's NIXL registration cannot partition a
    block-outermost view into kernel blocks (it asserts), so keep the stock layout."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.v1.worker.utils import select_common_block_size

        block_size = vllm_config.cache_config.block_size
        kernel = select_common_block_size(block_size, list(get_current_attn_backends(vllm_config)))
    except Exception as e:  # cannot tell here; registration (block_count.py) still refuses with the cause
        info_once("kernel-split", "could not compare the attention kernel block with the KV block here (%s: %s); "
                  "NIXL registration checks the block counts instead (block_count.py)", type(e).__name__, e)
        return None
    if isinstance(block_size, int) and isinstance(kernel, int) and kernel < block_size:
        return ("the attention kernel block (%d tokens) is smaller than the KV block (%d tokens), and vLLM's NIXL "
                "registration cannot split a block-outermost layout into kernel blocks" % (kernel, block_size))
    return None


def layout_wrapper(wrapped, cls, args, kwargs):
    stock = wrapped(*args, **kwargs)
    (vllm_config,) = bind(args, kwargs, "vllm_config")
    model = getattr(vllm_config, "model_config", None)
    if stock is None and getattr(model, "use_mla", False):
        # NixlConnector asks for no layout for MLA (one latent cache per layer): the stock layout
        fallback("mla", "MLA models keep the stock layout (NixlConnector requests no KV cache layout for them)")
        return stock
    excluded = _exclusion(vllm_config) if stock is not None else None
    if excluded:
        fallback(excluded, excluded)
        return stock
    decision = layout.layout_decision(stock=stock, env_layout=os.environ.get("VLLM_KV_CACHE_LAYOUT"))
    if not decision.use:
        _state.note_stock_reason(decision.reason)
        info_once("layout:" + decision.reason, "keeping KV cache layout %s: %s", stock, decision.reason)
        return stock
    info_once("layout", "%s requests KV cache layout %s instead of %s (%s)", getattr(cls, "__name__", cls),
              layout.BLOCK_OUTERMOST_LAYOUT, stock, decision.reason)
    return layout.BLOCK_OUTERMOST_LAYOUT
