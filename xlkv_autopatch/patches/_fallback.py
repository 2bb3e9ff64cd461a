"""ENABLE_XLKV is on but a configuration keeps the stock layout: one WARNING per cause, or with
XLKV_STRICT=1 an error; the cause is remembered for the handshake's refusal (_state.py)."""

from ..errors import XlkvError
from ..flag import knob
from ..logs import logger, once
from . import _state


def strict():
    """XLKV_STRICT through the one knob parser: an unrecognised value raises XlkvFlagError
    (start-up refuses it first, with ENABLE_XLKV on)."""
    return knob("XLKV_STRICT")


def fallback(key, reason):
    """ENABLE_XLKV is on but this configuration keeps the stock layout.

    One WARNING per process and cause; with XLKV_STRICT=1 an error instead.  The reason
    is remembered, so a handshake refusal can name it.
    """
    message = "ENABLE_XLKV is set but the stock per-layer KV layout is kept: %s" % reason
    _state.note_stock_reason(reason)
    if strict():
        raise XlkvError("xlkv_autopatch: %s (XLKV_STRICT=1 makes this an error; unset XLKV_STRICT to run "
                        "with the stock layout, or unset ENABLE_XLKV)" % message)
    if once(("fallback", key)):
        logger.warning("xlkv_autopatch: %s", message)
