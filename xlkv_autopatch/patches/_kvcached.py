"""kvcached's autopatch and ENABLE_XLKV together: refused (the precheck of every NIXL patch set)."""

import os

from ..errors import XlkvError
from ..flag import flag_on, truthy

KVCACHED_FLAGS = ("ENABLE_KVCACHED", "KVCACHED_AUTOPATCH")


def kvcached_flags():
    return [f for f in KVCACHED_FLAGS if truthy(os.environ.get(f))]


def refuse_kvcached():
    """kvcached's autopatch rewrites the same NIXL layout hooks with a different layout.

    Only a conflict while ENABLE_XLKV is on: kvcached alone is none of xlkv's business.
    """
    on = kvcached_flags()
    if on and flag_on():
        raise XlkvError(
            "xlkv_autopatch: %s and ENABLE_XLKV are both set: kvcached's NIXL patch rewrites "
            "NixlConnector.get_required_kvcache_layout and register_kv_caches for its own KV layout, which "
            "contradicts the cross-layer layout. Fix: unset ENABLE_XLKV (or %s) on prefill and decode alike"
            % ("/".join(on), on[0]))
