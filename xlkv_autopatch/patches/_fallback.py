"""ENABLE_XLKV is on but a configuration keeps the stock layout: one WARNING per cause, or with
XLKV_STRICT=1 an error; the cause is remembered for the handshake's refusal (_state.py)."""

import os

from .. import facts, layout
from ..errors import XlkvError
from ..flag import knob
from ..logs import info_once, logger, once
from . import _state


def strict():
    """XLKV_STRICT through the one knob parser: an unrecognised value raises XlkvFlagError
    (start-up refuses it first, with ENABLE_XLKV on)."""
    return knob("XLKV_STRICT")


def fallback(key, reason, *, chosen=False, fix=None):
    """ENABLE_XLKV is on but this configuration keeps the stock layout.

    One WARNING per process and cause (``chosen``: an INFO line, where xlkv keeps the stock layout
    by design, so that every TP pairing is served: layout.kept_for_any_tp); with XLKV_STRICT=1 an
    error instead.  The reason is remembered, so a handshake refusal can name it; ``fix``, where one
    setting brings xlkv's layout back, ends the line (it is not part of the remembered reason).
    """
    message = "ENABLE_XLKV is set but the stock per-layer KV layout is kept: %s" % reason
    if fix:
        message += ". To run xlkv's layout: %s" % fix
    _state.note_stock_reason(reason)
    if strict():
        raise XlkvError("xlkv_autopatch: %s (XLKV_STRICT=1 makes this an error; unset XLKV_STRICT to run "
                        "with the stock layout, or unset ENABLE_XLKV)" % message)
    if once(("fallback", key)):
        (logger.info if chosen else logger.warning)("xlkv_autopatch: %s", message)


def equal_tp():
    """XLKV_EQUAL_TP through the one knob parser (layout.kept_for_any_tp says what it changes)."""
    return knob(layout.EQUAL_TP_KNOB)


def explicit_layout():
    """vLLM 0.29+: an explicit VLLM_KV_CACHE_LAYOUT decides the layout before the connector is asked
    (``resolve_kv_cache_layout``), so kv_cache_layout.py never runs; said here, at registration, in
    every flagged worker: a stock layout is a fallback (WARNING; XLKV_STRICT=1: an error), a
    whole-row one an INFO line."""
    if facts.current().mechanism != "layout":
        return
    decision = layout.explicit_layout(os.environ.get("VLLM_KV_CACHE_LAYOUT"))
    if decision is None:
        return
    if not decision.use:
        fallback("explicit-layout", decision.reason)
    else:
        info_once("explicit-layout", "%s", decision.reason)
