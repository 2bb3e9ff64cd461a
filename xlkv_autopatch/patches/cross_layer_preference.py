"""NixlConnector.prefer_cross_layer_blocks: ask the V1 model runner for one cross-layer KV tensor.

Why
    vLLM's V1 model runner allocates all layers' KV cache as one tensor whose block
    dimension is outermost only when the connector's ``prefer_cross_layer_blocks`` is
    True.  NixlConnector says False unless the user opts in per engine
    (``kv_connector_extra_config={"enable_cross_layers_blocks": "True"}``, 0.16-0.28) or
    not at all (0.12-0.15).  Without it every block costs one NIXL descriptor per layer
    and per K/V.
How
    With ENABLE_XLKV set, the attribute answers as if the opt-in were given, keeping
    upstream's own guards: 0.16-0.28 call the original property on a read-only view of
    the connector whose extra config carries the opt-in (the user's config is never
    edited); 0.12-0.15 (no NIXL support upstream) apply the same guards here (FLASH_ATTN
    or FLASHINFER backend, HND layout, one KV group, no Mamba).  Both add the model
    families that keep the stock layout (families.decide: MLA, sliding-window hybrids
    with several KV cache groups before 0.24, whose WARNING names the family; 0.24-0.28
    pack those groups instead, packed_kv_cache_config.py, and the property keeps vLLM's
    own answer for them) and host-buffer mode to the exclusions.  0.26-0.28, MLA models:
    vLLM's guard accepts no MLA backend, although the five dense MLA backends already index
    their latent cache by the block stride (stride order (1, 0, 2, 3), which vLLM's
    OffloadingConnector relies on); under the flag the property answers True for the MLA
    backends run with xlkv on a GPU (releases.MLA_BACKENDS), and the others keep the
    stock layout with a WARNING naming the backend.  A configuration that keeps the stock layout logs
    one WARNING saying why (XLKV_STRICT=1: an error).  An explicit
    ``enable_cross_layers_blocks=false`` wins.  Heterogeneous TP: an engine
    cannot know its peers' TP size at start-up, so where the cross-layer block that vLLM would
    allocate cannot be sliced by KV heads (``layout.sliced_by_heads``: every backend but FLASH_ATTN,
    and FLASH_ATTN on 0.23-0.25) the property answers False and the engine keeps the stock layout,
    which serves any pairing, with one INFO line (XLKV_STRICT=1: an error), unless XLKV_EQUAL_TP=true
    (every peer runs this TP size) or the user's own ``enable_cross_layers_blocks=true`` says otherwise.
vLLM versions
    0.12-0.13: ``ClassVar[bool]`` on the base class, overridden on NixlConnector by a
    descriptor; 0.14-0.15: base ``@property`` overridden on NixlConnector; 0.16-0.23:
    NixlConnector's own property; 0.24-0.28: NixlBaseConnector's (pull and push).
    0.29+ removed the API (see kv_cache_layout.py).
Removal
    When the oldest supported release has cross-layer blocks on by default for NIXL.
"""

import os
import sys

from .. import facts, families, layout
from ..logs import info_once
from ..specs import NIXL_CONNECTOR_MODULE, Target
from . import _model, _state
from ._config import spec_names
from ._fallback import equal_tp, fallback

OPT_IN = "enable_cross_layers_blocks"


class _ExtraConfigView:
    """kv_transfer_config as the original property sees it: opt-in added, rest delegated."""

    def __init__(self, config):
        self._config = config
        extra = dict(getattr(config, "kv_connector_extra_config", None) or {})
        extra[OPT_IN] = "True"
        self.kv_connector_extra_config = extra

    def __getattr__(self, name):
        return getattr(self._config, name)


class _OptInView:
    """The connector as the original property sees it (attribute reads only)."""

    def __init__(self, connector):
        object.__setattr__(self, "_connector", connector)
        object.__setattr__(self, "kv_transfer_config", _ExtraConfigView(connector.kv_transfer_config))

    def __getattr__(self, name):
        return getattr(self._connector, name)


def _kv_cache_config(connector):
    return getattr(connector, "kv_cache_config", None) or getattr(connector, "_kv_cache_config", None)


def _engine_model(connector):
    """families.decide for the connector's engine, with the KV cache groups vLLM planned (None
    without a model config)."""
    return _model.decision(connector._vllm_config,
                           kv_cache_groups=_model.kv_cache_group_count(_kv_cache_config(connector)))


def _property_module(getter, connector):
    """The module whose globals vLLM's property reads (``get_current_attn_backend``, ...)."""
    return sys.modules[getattr(getter, "__module__", None) or type(connector).__module__]


def _extra_guards(connector, model):
    """Exclusions upstream's property leaves to other layers: the model's family (``model``:
    MLA, sparse MLA, Mamba, sliding-window hybrids with several KV cache groups before 0.24:
    families.decide), host buffer."""
    if model is not None and not model.cross_layer:
        return layout.Decision(False, model.reason)
    worker = getattr(connector, "connector_worker", None)
    if worker is not None and getattr(worker, "use_host_buffer", False):
        return layout.Decision(False, "host-buffer mode (kv_buffer_device=cpu) copies per layer")
    return layout.Decision(True, "")


def _packed_by_the_planner(connector, model):
    """0.24-0.28: a sliding-window hybrid with several KV cache groups, which the planner packs
    (packed_kv_cache_config.py); one cross-layer tensor is not its layout."""
    if not facts.current().packed_groups:
        return False
    groups = _model.kv_cache_group_count(_kv_cache_config(connector))
    if not isinstance(groups, int) or groups < 2:
        return False
    return model is not None and model.family == families.SLIDING_WINDOW and model.cross_layer


def native_wrapper(wrapped, instance, args, kwargs):
    """0.16-0.28: the original property, evaluated with the opt-in present."""
    explicit = (instance.kv_transfer_config.kv_connector_extra_config or {}).get(OPT_IN)
    if explicit is not None and str(explicit).strip().lower() != "true":
        fallback("explicit-opt-out", "kv_connector_extra_config sets %s=%s" % (OPT_IN, explicit))
        return wrapped(*args, **kwargs)
    model = _engine_model(instance)
    if _packed_by_the_planner(instance, model):
        return wrapped(*args, **kwargs)  # one tensor cannot hold several groups: vLLM's own answer, no WARNING
    extra = _extra_guards(instance, model)
    if not extra.use:
        # a family kept stock by design (its decision is what _extra_guards names first): an INFO line
        fallback(extra.reason, extra.reason, chosen=bool(model is not None and model.for_any_tp))
        return False
    mla = _mla_decision(wrapped, instance, model)
    if mla is not None:  # 0.26-0.28, MLA: vLLM's own guard has no MLA backend (module docstring)
        if not mla.use:
            fallback(mla.reason, mla.reason)
            return False
        _state.note_cross_layer_preferred()
        info_once("prefer", "NixlConnector prefers cross-layer KV blocks (%s)", mla.reason)
        return True
    result = bool(wrapped(_OptInView(instance)))
    # an explicit enable_cross_layers_blocks=true is the user's own choice of vLLM's cross-layer blocks: kept
    unsliceable = _unsliceable(_property_module(wrapped, instance).get_current_attn_backend(
        instance._vllm_config).get_name()) if result and explicit is None else None
    if unsliceable:
        fallback(unsliceable, unsliceable, chosen=True)
        return False
    if result:
        _state.note_cross_layer_preferred()
        info_once("prefer", "NixlConnector prefers cross-layer KV blocks (vLLM's own guards passed)")
    else:
        reason = _native_refusal(wrapped, instance)
        fallback(reason, reason)
    return result


def _unsliceable(backend):
    """Why this engine keeps the stock layout instead of cross-layer blocks of ``backend`` that
    cannot be sliced by KV heads (families.kept_stock_for_any_tp, which status asks too), or None."""
    return families.kept_stock_for_any_tp(backend, facts.current(), equal_tp=equal_tp())


def _mla_decision(getter, connector, model):
    """0.26-0.28, an MLA ``model`` the family rule gives cross-layer blocks (families.decide): use them
    where the engine's MLA backend is one xlkv was run with on a GPU (releases.MLA_BACKENDS) and indexes its
    latent cache by the block stride (the backend's own ``indexes_kv_by_block_stride``, which vLLM's
    model runner checks again before allocating), with no Mamba group.  None: not such a model."""
    backends = facts.current().mla_cross_layer_backends
    if not backends or model is None or model.family != families.MLA or not model.cross_layer:
        return None
    backend = _property_module(getter, connector).get_current_attn_backend(connector._vllm_config)
    name = backend.get_name()
    if name not in backends:
        return layout.Decision(False, "MLA attention backend %s: keeps the stock layout (xlkv's MLA cross-layer "
                                      "blocks were run on a GPU with %s only)" % (name, ", ".join(backends)))
    _, has_mamba, _groups = spec_names(_kv_cache_config(connector))
    if has_mamba:
        return layout.Decision(False, "MLA with Mamba KV cache groups: keeps the stock layout")
    indexes = getattr(backend, "indexes_kv_by_block_stride", None)
    if callable(indexes) and not indexes():
        return layout.Decision(False, "MLA attention backend %s does not index its latent cache by the block "
                                      "stride on this vLLM: keeps the stock layout" % name)
    return layout.Decision(True, "MLA attention backend %s reads its latent cache by the block stride: one "
                                 "cross-layer latent KV tensor" % name)


def _native_refusal(getter, connector):
    """Which of vLLM's own guards said no, read from the module globals the property uses
    (0.16-0.28: Mamba groups, ``get_current_attn_backend``, ``get_kv_cache_layout``)."""
    backends = facts.current().cross_layer_backends
    generic = ("vLLM's cross-layer guards refused (backend not in %s, KV layout not HND, or a Mamba/hybrid model)"
               % ", ".join(backends))
    try:
        module = _property_module(getter, connector)
        backend = module.get_current_attn_backend(connector._vllm_config).get_name()
        _, has_mamba, _groups = spec_names(_kv_cache_config(connector))
        decision = layout.cross_layer_decision(
            backend=backend, kv_layout=module.get_kv_cache_layout(), allowed_backends=backends,
            has_mamba=has_mamba, env_layout=os.environ.get("VLLM_KV_CACHE_LAYOUT"))
    except Exception:
        return generic
    return generic if decision.use else decision.reason


def _backport_decision(connector):
    """(the decision, whether a stock answer is layout.kept_for_any_tp) or None on the scheduler side."""
    worker = getattr(connector, "connector_worker", None)
    if worker is None:  # scheduler side: the model runner never asks there
        return None
    module = sys.modules[type(connector).__module__]
    _, has_mamba, groups = spec_names(getattr(connector, "_kv_cache_config", None))
    explicit = (connector._vllm_config.kv_transfer_config.kv_connector_extra_config or {}).get(OPT_IN)
    decision = layout.cross_layer_decision(
        backend=worker.backend_name,
        kv_layout=module.get_kv_cache_layout(),
        allowed_backends=facts.current().cross_layer_backends,
        has_mamba=has_mamba,
        num_kv_groups=groups or 1,
        host_buffer=getattr(worker, "use_host_buffer", False),
        explicit_opt_in=explicit,
        env_layout=os.environ.get("VLLM_KV_CACHE_LAYOUT"),
    )
    model = _model.decision(connector._vllm_config, kv_cache_groups=groups)
    if model is not None and not model.cross_layer and (decision.use or model.family == families.SLIDING_WINDOW):
        return layout.Decision(False, model.reason), False  # the family named (several KV cache groups: the hybrid)
    if decision.use and explicit is None and (model is None or model.family != families.MLA):
        unsliceable = _unsliceable(worker.backend_name)
        if unsliceable:
            return layout.Decision(False, unsliceable), True
    return decision, False


def _backport_result(connector):
    decided = _backport_decision(connector)
    if decided is None:
        return None
    decision, for_any_tp = decided
    if decision.use:
        _state.note_cross_layer_preferred()
        info_once("prefer", "NixlConnector prefers cross-layer KV blocks (%s)", decision.reason)
    else:
        fallback(decision.reason, decision.reason, chosen=for_any_tp)
    return decision.use


def backport_property_wrapper(wrapped, instance, args, kwargs):
    """0.14-0.15: base property (False) overridden on NixlConnector."""
    result = _backport_result(instance)
    return wrapped(*args, **kwargs) if result is None else result


def backport_attribute(original, instance, owner):
    """0.12-0.13: ClassVar False overridden on NixlConnector (class access stays False)."""
    if instance is None:
        return original
    result = _backport_result(instance)
    return original if result is None else result


#: what this file wraps: NixlConnector.prefer_cross_layer_blocks on the cross-layer-block releases (the
#: release table's ``mechanism``): NIXL's own property on the native ones; on the backport ones the base
#: class's attribute, overridden on NixlConnector itself, as it is there (the ``prefer`` column: a
#: ClassVar[bool], or a property)
_ON_CONNECTOR = dict(group="nixl", module=NIXL_CONNECTOR_MODULE, owner="NixlConnector",
                     attr="prefer_cross_layer_blocks")
TARGETS = (
    Target(name="cross_layer_preference.native", kind="property", wrapper=native_wrapper,
           when={"mechanism": "native"}, **_ON_CONNECTOR),
    Target(name="cross_layer_preference.backport", kind="attribute", wrapper=backport_attribute, on_named_class=True,
           when={"mechanism": "backport", "prefer": "classvar"}, **_ON_CONNECTOR),
    Target(name="cross_layer_preference.backport", kind="property", wrapper=backport_property_wrapper,
           on_named_class=True, when={"mechanism": "backport", "prefer": ("base-property", "property")},
           **_ON_CONNECTOR),
)
