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
    the wrapper logs that once.
vLLM versions
    0.29-0.33.
Removal
    When NixlConnector itself prefers a block-outermost layout.
"""

import os

from .. import layout
from ._glue import info_once


def layout_wrapper(wrapped, cls, args, kwargs):
    stock = wrapped(*args, **kwargs)
    decision = layout.layout_decision(stock=stock, env_layout=os.environ.get("VLLM_KV_CACHE_LAYOUT"))
    if not decision.use:
        info_once("layout:" + decision.reason, "keeping KV cache layout %s: %s", stock, decision.reason)
        return stock
    info_once("layout", "%s requests KV cache layout %s instead of %s (%s)", getattr(cls, "__name__", cls),
              layout.BLOCK_OUTERMOST_LAYOUT, stock, decision.reason)
    return layout.BLOCK_OUTERMOST_LAYOUT
