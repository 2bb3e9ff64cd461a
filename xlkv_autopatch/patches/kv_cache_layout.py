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
    by the pull/push connectors and the ``NixlConnector`` alias).  The model's family decides
    first (:func:`xlkv_autopatch.families.decide`, one rule for every patch and for ``status
    --model``): dense models, sliding-window + full hybrids (every KV cache group shares one
    whole-row region), MLA models (NixlConnector asks for no layout for them; under a
    block-outermost layout vLLM registers each block's packed latent row as one region) and one
    KV head per tensor-parallel rank (page_contiguous.py has vLLM register each row as one
    region) get ``BLNHC``; sparse-indexer MLA (DeepSeek-V3.2 / GLM-5), Mamba hybrids, and MLA or
    one KV head per rank with pipeline parallel > 1 keep what NixlConnector asked for, with one
    WARNING naming the family (XLKV_STRICT=1: an error).  Then host-buffer mode and a kernel
    block smaller than the KV block (vLLM's own ``select_common_block_size`` for the engine's
    attention backends; vLLM cannot register such a block-outermost layout) keep the stock
    layout the same way.  vLLM still validates the preference against the attention
    backends' supported layouts and falls back (with its own warning) where it is not
    allowed, e.g. FlashInfer on SM100; the hash patch then publishes the stock hash, since
    the layout really is stock.  An explicit ``VLLM_KV_CACHE_LAYOUT`` always wins: vLLM 0.33 reads
    it before asking the connector (``resolve_kv_cache_layout``, ``v1/attention/backends/utils.py``
    :362), so this wrapper never runs then; page_contiguous.py says so at registration instead
    (a stock layout: a WARNING, with XLKV_STRICT=1 an error) and ``status`` predicts it.
vLLM versions
    0.29+.
Removal
    When NixlConnector itself prefers a block-outermost layout.
"""

import os

from .. import layout
from ..logs import info_once
from ..specs import NIXL_CONNECTOR_MODULE, Target
from . import _model, _state
from ._args import bind
from ._fallback import fallback

#: get_required_kvcache_layout's parameters after cls, bound by name
LAYOUT_ARGS = ("vllm_config",)

def _exclusion(vllm_config):
    """Engine settings that keep the stock layout whatever the model (host-buffer copies, a
    kernel block smaller than the KV block): ``(cause, the setting that brings xlkv's layout back)``,
    or None."""
    kvt = getattr(vllm_config, "kv_transfer_config", None)
    if getattr(kvt, "kv_buffer_device", None) == "cpu":
        from vllm.platforms import current_platform

        if current_platform.device_type != "cpu":
            return ("host-buffer mode (kv_buffer_device=cpu) copies per layer",
                    "leave kv_buffer_device out of --kv-transfer-config on prefill and decode (device buffers)")
    return _kernel_split(vllm_config)


def _kernel_split(vllm_config):
    """A kernel block smaller than the KV block: vLLM's NIXL registration cannot partition a
    block-outermost view into kernel blocks (it asserts), so keep the stock layout; ``(cause, fix)``
    or None."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.v1.worker.utils import select_common_block_size

        block_size = vllm_config.cache_config.block_size
        kernel = select_common_block_size(block_size, list(get_current_attn_backends(vllm_config)))
    except Exception as e:  # cannot tell here; registration (block_count.py) still refuses with the cause
        info_once("kernel-split", "could not compare the attention kernel block with the KV block here (%s: %s); "
                  "NIXL registration checks the block counts instead (block_count.py)", type(e).__name__, e)
        return None
    if isinstance(block_size, int) and isinstance(kernel, int):
        reason = layout.kernel_split_reason(kernel, block_size)  # status --kernel-block-size asks the same
        if reason:
            return reason, "set --block-size %d (the attention kernel block) on prefill and decode" % kernel
    return None


def layout_wrapper(wrapped, cls, args, kwargs):
    stock = wrapped(*args, **kwargs)
    (vllm_config,) = bind(args, kwargs, *LAYOUT_ARGS)
    model = _model.decision(vllm_config)
    if model is None:  # vLLM warns itself ("Unable to detect current VLLM config")
        _state.note_stock_reason("no model config: NixlConnector requests no KV cache layout")
        return stock
    if not model.cross_layer:
        fallback(model.family, model.reason)
        return stock
    excluded = _exclusion(vllm_config)
    if excluded:
        reason, fix = excluded
        fallback(reason, reason, fix=fix)
        return stock
    decision = layout.layout_decision(stock=stock, env_layout=os.environ.get("VLLM_KV_CACHE_LAYOUT"))
    if not decision.use:
        _state.note_stock_reason(decision.reason)
        info_once("layout:" + decision.reason, "keeping KV cache layout %s: %s", stock, decision.reason)
        return stock
    info_once("layout", "%s requests KV cache layout %s (%s; %s)", getattr(cls, "__name__", cls),
              model.layout, model.reason, decision.reason)
    return model.layout


#: what this file wraps: NixlConnector's KV-cache layout request, on the KV-cache-layout releases (the
#: release table's ``mechanism``)
TARGETS = (
    Target(name="kv_cache_layout.block_outermost", group="nixl", module=NIXL_CONNECTOR_MODULE, owner="NixlConnector",
           attr="get_required_kvcache_layout", kind="classmethod", wrapper=layout_wrapper,
           params=("cls",) + LAYOUT_ARGS, when={"mechanism": "layout"}),
)
