"""Shared vLLM glue for the patches: module names, strict mode and fallbacks, reading
configs, binding wrapped arguments.  Reads vLLM objects; decides nothing itself (the
rules are in :mod:`..layout`, the release differences in :mod:`..facts`)."""

from ..flag import knob
from ..errors import XlkvError
from ..logs import logger, once
from . import _state

V1 = "vllm.distributed.kv_transfer.kv_connector.v1"
N = V1 + ".nixl_connector"  # 0.12-0.19: one module
PKG = V1 + ".nixl"  # 0.20+: package
C = PKG + ".connector"
W = PKG + ".worker"
BW = PKG + ".base_worker"
MC = V1 + ".multi_connector"
CFG = "vllm.config.vllm"
FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"

NIXL_CONNECTORS = ("NixlConnector", "NixlPullConnector", "NixlPushConnector")


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


def uses_nixl(kv_transfer_config):
    """Does this KV-transfer config run a NixlConnector (directly or in a MultiConnector)?"""
    if kv_transfer_config is None:
        return False
    name = getattr(kv_transfer_config, "kv_connector", None)
    if name in NIXL_CONNECTORS:
        return True
    if name == "MultiConnector":
        extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
        for child in extra.get("connectors", []) or []:
            if isinstance(child, dict) and child.get("kv_connector") in NIXL_CONNECTORS:
                return True
    return False


def spec_names(kv_cache_config):
    """(layer names, has_mamba, number of groups) from a KVCacheConfig, tolerant of None."""
    if kv_cache_config is None:
        return [], False, None
    groups = list(getattr(kv_cache_config, "kv_cache_groups", []) or [])
    names = []
    mamba = False
    for g in groups:
        names.extend(getattr(g, "layer_names", []) or [])
        if "Mamba" in type(getattr(g, "kv_cache_spec", None)).__name__:
            mamba = True
    return names, mamba, len(groups)


def bind(args, kwargs, *names):
    """Positional-or-keyword arguments of a wrapped call, by name (self excluded).

    Only for targets whose PatchSpec checks ``params``: the positions are the ones the
    registry verified before patching.
    """
    out = []
    for i, n in enumerate(names):
        if n in kwargs:
            out.append(kwargs[n])
        elif i < len(args):
            out.append(args[i])
        else:
            out.append(None)
    return out
