"""Reading vLLM configuration objects (duck-typed, tolerant of None): does an engine run a NIXL
connector, which layers and KV-cache groups does it have.  Decides nothing (the rules are in
:mod:`..layout`)."""

NIXL_CONNECTORS = ("NixlConnector", "NixlPullConnector", "NixlPushConnector")


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


def other_connectors(kv_transfer_config):
    """The connectors of a MultiConnector that are not NIXL connectors (sorted names; [] for a plain
    connector or a MultiConnector of NIXL connectors only)."""
    if getattr(kv_transfer_config, "kv_connector", None) != "MultiConnector":
        return []
    extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
    children = [c.get("kv_connector") for c in extra.get("connectors", []) or [] if isinstance(c, dict)]
    return sorted({str(c) for c in children} - set(NIXL_CONNECTORS))


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
