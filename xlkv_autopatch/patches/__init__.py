"""The patch sets, one file per vLLM concept they change (see each module's docstring).

=========================  ==================================================  ==========
file                       vLLM attribute                                       releases
=========================  ==================================================  ==========
cross_layer_preference     NixlConnector.prefer_cross_layer_blocks              0.12-0.28
cross_layer_registration   NixlConnector.register_cross_layers_kv_cache         0.12-0.15
model_runner               VllmConfig.use_v2_model_runner                       0.22-0.28
kv_cache_layout            NixlConnector.get_required_kvcache_layout            0.29-0.33
compat_hash                compute_nixl_compatibility_hash (worker module)      0.16-0.33
handshake                  NixlConnectorWorker._nixl_handshake,                 0.13-0.33
                           NixlConnectorWorker.add_remote_agent,                0.12-0.33
                           NixlConnectorWorker.get_finished                     0.12-0.23
block_count                NixlConnectorWorker.register_kv_caches               0.12-0.33
multi_connector            MultiConnector.prefer_cross_layer_blocks,            0.12-0.28
                           MultiConnector.register_cross_layers_kv_cache        0.12-0.13
kv_connector_factory       KVConnectorFactory.create_connector                  all
transfer_order             nixl_wrapper.make_prepped_xfer (per worker)          0.12-0.33
=========================  ==================================================  ==========

``transfer_order`` wraps no class attribute: block_count's registration wrapper attaches
it to the NIXL agent object of each worker that registered a cross-layer layout
(:data:`INSTANCE_PATCHES`).

(tests/unit/test_structure.py checks this table against :func:`all_groups` and :data:`INSTANCE_PATCHES`.)

:func:`all_groups` returns every :class:`~xlkv_autopatch.specs.PatchGroup`; the
registry keeps those whose range contains the installed vLLM (and the ``always`` guard).
A group is applied all-or-nothing when its trigger module is imported.  What differs
between releases *inside* a wrapper (hash or not, which layouts keep heads outermost)
is in :mod:`xlkv_autopatch.facts`; which targets exist where is declared here.
"""

import os

from ..flag import flag_on, truthy
from ..errors import XlkvError
from ..specs import PatchGroup, PatchSpec
from . import (block_count, compat_hash, cross_layer_preference, cross_layer_registration, handshake,
               kv_cache_layout, kv_connector_factory, model_runner, multi_connector)
from ._glue import BW, C, CFG, FACTORY, MC, N, PKG, W

KVCACHED_FLAGS = ("ENABLE_KVCACHED", "KVCACHED_AUTOPATCH")
#: patches attached to objects at run time rather than declared as PatchSpecs:
#: (file, attribute) -> releases (the releases of the group that attaches them)
INSTANCE_PATCHES = {("transfer_order", "make_prepped_xfer"): "0.12-0.33"}


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


def _worker_specs(module, worker_cls, register=True, handshake_hash=True, failed_recv=False):
    """add_remote_agent, _nixl_handshake (releases with a compatibility hash), register_kv_caches,
    get_finished (releases whose failure path looks up a refused engine: facts.py)."""
    specs = [
        PatchSpec("handshake.validate", module, worker_cls, "add_remote_agent", "method",
                  handshake.validate_wrapper, params=ADD_REMOTE_AGENT_PARAMS),
    ]
    if failed_recv:
        specs.append(PatchSpec("handshake.failed_recv", module, worker_cls, "get_finished", "method",
                               handshake.finished_wrapper, params=("self",)))
    if handshake_hash:
        specs.append(PatchSpec("handshake.explain_mismatch", module, worker_cls, "_nixl_handshake", "method",
                               handshake.handshake_wrapper, params=("self", "host", "port", "remote_tp_size", "...")))
    if register:
        specs.append(PatchSpec("block_count.register_kv_caches", module, worker_cls, "register_kv_caches", "method",
                               block_count.register_wrapper, params=("self", "kv_caches")))
    return specs


def _hash_spec(module, params):
    wrapper = compat_hash.layout_hash_wrapper if "cross_layers_blocks" not in params else compat_hash.flag_hash_wrapper
    return PatchSpec("compat_hash.tag", module, None, "compute_nixl_compatibility_hash", "function", wrapper,
                     params=params)


#: 0.33 appends remote_dcp_size; the wrapper binds only the first three after self
ADD_REMOTE_AGENT_PARAMS = ("self", "nixl_agent_meta", "remote_tp_rank", "remote_tp_size", "...")
HASH_0_16 = ("vllm_config", "attn_backend_name", "cross_layers_blocks")
HASH_0_28 = HASH_0_16 + ("transfer_mode",)
HASH_0_29 = ("vllm_config", "attn_backend_name", "transfer_mode")
LAYOUT_PARAMS = ("cls", "vllm_config")
XL_REGISTER_PARAMS = ("self", "kv_cache", "attn_backend")


def _backport_group(name, rng, prefer, handshake_hash=True):
    return PatchGroup(name, N, rng, tuple([
        prefer,
        PatchSpec("cross_layer_registration.redirect", N, "NixlConnector", "register_cross_layers_kv_cache",
                  "method", cross_layer_registration.redirect_wrapper, params=XL_REGISTER_PARAMS,
                  on_named_class=True),
    ] + _worker_specs(N, "NixlConnectorWorker", handshake_hash=handshake_hash, failed_recv=True)),
        precheck=refuse_kvcached)


#: 0.12-0.13: the base class's ClassVar[bool], overridden on NixlConnector
PREFER_CLASSVAR = PatchSpec("cross_layer_preference.backport", N, "NixlConnector", "prefer_cross_layer_blocks",
                            "attribute", cross_layer_preference.backport_attribute, on_named_class=True)


def _native_prefer(module, owner):
    return PatchSpec("cross_layer_preference.native", module, owner, "prefer_cross_layer_blocks", "property",
                     cross_layer_preference.native_wrapper)


def all_groups():
    return [
        _backport_group("backport-0.12", ">=0.12,<0.13", PREFER_CLASSVAR, handshake_hash=False),  # no hash yet
        _backport_group("backport-0.13", ">=0.13,<0.14", PREFER_CLASSVAR),
        _backport_group("backport-0.14", ">=0.14,<0.16", PatchSpec(
            "cross_layer_preference.backport", N, "NixlConnector", "prefer_cross_layer_blocks", "property",
            cross_layer_preference.backport_property_wrapper, on_named_class=True)),
        PatchGroup("native-0.16", N, ">=0.16,<0.20", tuple(
            [_native_prefer(N, "NixlConnector"), _hash_spec(N, HASH_0_16)]
            + _worker_specs(N, "NixlConnectorWorker", failed_recv=True)),
            precheck=refuse_kvcached),
        PatchGroup("native-0.20", PKG, ">=0.20,<0.24", tuple(
            [_native_prefer(C, "NixlConnector"), _hash_spec(W, HASH_0_16)]
            + _worker_specs(W, "NixlConnectorWorker", failed_recv=True)),
            precheck=refuse_kvcached),
        PatchGroup("native-0.24", PKG, ">=0.24,<0.28", tuple(
            [_native_prefer(C, "NixlConnector"), _hash_spec(BW, HASH_0_16)]
            + _worker_specs(BW, "NixlBaseConnectorWorker")),
            precheck=refuse_kvcached),
        PatchGroup("native-0.28", PKG, ">=0.28,<0.29", tuple(
            [_native_prefer(C, "NixlConnector"), _hash_spec(BW, HASH_0_28)]
            + _worker_specs(BW, "NixlBaseConnectorWorker")),
            precheck=refuse_kvcached),
        PatchGroup("runner-v1", CFG, ">=0.22,<0.29", (
            PatchSpec("model_runner.force_v1", CFG, "VllmConfig", "use_v2_model_runner", "property",
                      model_runner.runner_wrapper),), nixl=False),
        PatchGroup("multi-0.12", MC, ">=0.12,<0.14", (
            PatchSpec("multi_connector.backport", MC, "MultiConnector", "prefer_cross_layer_blocks", "attribute",
                      multi_connector.backport_attribute, on_named_class=True),
            PatchSpec("multi_connector.register", MC, "MultiConnector", "register_cross_layers_kv_cache", "method",
                      multi_connector.register_wrapper, params=XL_REGISTER_PARAMS, on_named_class=True)),
            nixl=False),
        PatchGroup("multi-0.14", MC, ">=0.14,<0.29", (
            PatchSpec("multi_connector.warn", MC, "MultiConnector", "prefer_cross_layer_blocks", "property",
                      multi_connector.property_wrapper),), nixl=False),
        PatchGroup("layout-0.29", PKG, ">=0.29,<0.34", tuple(
            [PatchSpec("kv_cache_layout.block_outermost", C, "NixlConnector", "get_required_kvcache_layout",
                       "classmethod", kv_cache_layout.layout_wrapper, params=LAYOUT_PARAMS),
             _hash_spec(BW, HASH_0_29)] + _worker_specs(BW, "NixlBaseConnectorWorker")),
            precheck=refuse_kvcached),
        PatchGroup("guard", FACTORY, ">=0", (
            PatchSpec("kv_connector_factory.guard", FACTORY, "KVConnectorFactory", "create_connector", "classmethod",
                      kv_connector_factory.factory_wrapper),), nixl=False, always=True),
    ]
