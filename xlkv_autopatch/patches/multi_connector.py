"""MultiConnector: make the same cross-layer decision as a plain NixlConnector, or say why not.

Why
    Operators (dynamo, LMCache setups) often run NixlConnector inside a MultiConnector on
    one side only.  Upstream's MultiConnector prefers cross-layer blocks only when *every*
    child connector does (0.14-0.28), and 0.12-0.13 have no MultiConnector support at
    all: the class inherits the base ``ClassVar`` False and the base no-op
    ``register_cross_layers_kv_cache``.  So a MultiConnector side silently keeps the
    per-layer layout while a plain-NixlConnector peer uses the cross-layer one (the dynamo
    issue #10027 failure: a hash mismatch nobody explains).
How
    0.12-0.13: backport upstream's later MultiConnector behaviour: the preference is the
    AND of the children's (so a MultiConnector around NixlConnector alone decides exactly
    like a plain NixlConnector), and ``register_cross_layers_kv_cache`` is passed to every
    child after the (no-op) original.  0.14-0.28: the original property is kept; when it
    says False although a NIXL child prefers cross-layer blocks, one WARNING names the
    children that refuse (XLKV_STRICT=1: an error), so the refusal a plain-NixlConnector
    peer then gets at handshake (handshake.py) is not a surprise.  0.29+ need nothing:
    MultiConnector asks each child's ``get_required_kvcache_layout`` (kv_cache_layout.py)
    and raises vLLM's own error when children disagree.
vLLM versions
    0.12-0.28.
Removal
    With 0.28 support (0.29+ decide the layout per child class).
"""

from ..releases import MULTI_CONNECTOR
from ..specs import Target
from ._config import NIXL_CONNECTORS
from ._fallback import fallback


def _children(connector):
    return list(getattr(connector, "_connectors", None) or [])


def _others(children):
    return sorted({type(c).__name__ for c in children if not bool(c.prefer_cross_layer_blocks)})


def backport_attribute(original, instance, owner):
    """0.12-0.13: MultiConnector.prefer_cross_layer_blocks = AND of its children."""
    if instance is None:
        return original
    children = _children(instance)
    if not children:
        return original
    result = all(bool(c.prefer_cross_layer_blocks) for c in children)
    if not result:
        _warn_if_nixl_wanted(children)
    return result


def register_wrapper(wrapped, instance, args, kwargs):
    """0.12-0.13: hand the cross-layer tensor to every child (the model runner calls this only
    when every child preferred cross-layer blocks)."""
    wrapped(*args, **kwargs)  # the base class's no-op, kept in the call chain
    for child in _children(instance):
        child.register_cross_layers_kv_cache(*args, **kwargs)


def property_wrapper(wrapped, instance, args, kwargs):
    """0.14-0.28: upstream's AND of the children, plus a WARNING when it drops NIXL's wish."""
    result = wrapped(*args, **kwargs)
    if not result:
        _warn_if_nixl_wanted(_children(instance))
    return result


def _warn_if_nixl_wanted(children):
    nixl = [c for c in children if type(c).__name__ in NIXL_CONNECTORS]
    if nixl and all(bool(c.prefer_cross_layer_blocks) for c in nixl):
        others = ", ".join(_others(children)) or "another connector"
        fallback("multi-connector",
                 "this MultiConnector also runs %s, which does not take cross-layer KV blocks, so the whole engine "
                 "keeps the per-layer layout; a decode/prefill peer with a plain NixlConnector and ENABLE_XLKV will "
                 "refuse the handshake. Use the same connector list on both sides" % others)


#: what this file wraps on MultiConnector (the release table's ``multi`` column; a patch set of its own, on
#: import of its module): backport, the base class's ClassVar and no-op registration overridden on
#: MultiConnector itself; warn, upstream's property
_ON_MULTI = dict(group="multi", module=MULTI_CONNECTOR, owner="MultiConnector")
TARGETS = (
    Target(name="multi_connector.backport", attr="prefer_cross_layer_blocks", kind="attribute",
           wrapper=backport_attribute, on_named_class=True, when={"multi": "backport"}, **_ON_MULTI),
    Target(name="multi_connector.register", attr="register_cross_layers_kv_cache", kind="method",
           wrapper=register_wrapper, params=("self", "kv_cache", "attn_backend"), on_named_class=True,
           when={"multi": "backport"}, **_ON_MULTI),
    Target(name="multi_connector.warn", attr="prefer_cross_layer_blocks", kind="property", wrapper=property_wrapper,
           when={"multi": "warn"}, **_ON_MULTI),
)
