"""The patch sets, one file per vLLM concept they change (see each module's docstring).

:func:`all_groups` derives every :class:`~xlkv_autopatch.specs.PatchGroup` from the release
table (:mod:`xlkv_autopatch.releases`): consecutive releases whose targets agree form one
group.  The registry keeps those whose range contains the installed vLLM (and the ``always``
guard); a group is applied all-or-nothing when its trigger module is imported.  What differs
between releases *inside* a wrapper (hash or not, which layouts keep heads outermost) is in
:mod:`xlkv_autopatch.facts`, from the same table.  The catalogue of every target and its
releases is rendered into docs/mechanism.md by :mod:`xlkv_autopatch.catalogue`.

``transfer_order`` wraps no class attribute: block_count's registration wrapper attaches
it to the NIXL agent object of each worker that registered a cross-layer layout
(:data:`INSTANCE_PATCHES`).
"""

import os

from .. import releases
from ..errors import XlkvError
from ..flag import flag_on, truthy
from ..specs import PatchGroup, PatchSpec
from . import (block_contiguous, block_count, compat_hash, cross_layer_preference, cross_layer_registration,
               handshake, kv_cache_layout, kv_connector_factory, model_runner, multi_connector,
               packed_kv_cache_config, page_contiguous)

KVCACHED_FLAGS = ("ENABLE_KVCACHED", "KVCACHED_AUTOPATCH")
#: vLLM 0.29+'s KV-cache layout enum (KVCacheLayout), whose head-slicing test block_contiguous.py wraps
KV_CACHE_LAYOUT = "vllm.v1.kv_cache_layout"
#: patches attached to objects at run time rather than declared as PatchSpecs:
#: (file, attribute, what it wraps) -> the PatchSpec name whose wrapper attaches them (so their
#: releases are that spec's)
INSTANCE_PATCHES = {("transfer_order", "make_prepped_xfer", "nixl_wrapper.make_prepped_xfer (per worker)"):
                    "block_count.register_kv_caches"}


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


#: 0.33 appends remote_dcp_size; the wrapper binds only the first three after self
ADD_REMOTE_AGENT_PARAMS = ("self", "nixl_agent_meta", "remote_tp_rank", "remote_tp_size", "...")
HANDSHAKE_PARAMS = ("self", "host", "port", "remote_tp_size", "...")
LAYOUT_PARAMS = ("cls", "vllm_config")
XL_REGISTER_PARAMS = ("self", "kv_cache", "attn_backend")


def _worker_specs(row):
    """add_remote_agent, get_finished (where the worker has the one the shim wraps: the failure path
    of facts.py), _nixl_handshake (releases that compare a compatibility hash), register_kv_caches,
    _register_packed_kv_cache (releases with vLLM's packed multi-group allocation)."""
    home = row.home
    on_worker = dict(module=home.worker, owner=home.worker_class, kind="method")
    specs = [PatchSpec(name="handshake.validate", attr="add_remote_agent", wrapper=handshake.validate_wrapper,
                       params=ADD_REMOTE_AGENT_PARAMS, **on_worker)]
    if row.finished:
        specs.append(PatchSpec(name="handshake.failed_recv", attr="get_finished", wrapper=handshake.finished_wrapper,
                               params=("self",), **on_worker))
    if row.hs_hash:
        specs.append(PatchSpec(name="handshake.explain_mismatch", attr="_nixl_handshake",
                               wrapper=handshake.handshake_wrapper, params=HANDSHAKE_PARAMS, **on_worker))
    specs.append(PatchSpec(name="block_count.register_kv_caches", attr="register_kv_caches",
                           wrapper=block_count.register_wrapper, params=("self", "kv_caches"), **on_worker))
    if row.packed:
        specs.append(PatchSpec(name="packed_kv_cache_config.register", attr="_register_packed_kv_cache",
                               wrapper=packed_kv_cache_config.register_wrapper, params=("self", "..."),
                               **on_worker))
    return specs


def _hash_specs(row):
    """compute_nixl_compatibility_hash where the release has it as a module function; one wrapper per
    signature (a ``cross_layers_blocks`` flag, 0.16-0.28, or the engine's KV layout, 0.29+)."""
    if row.hash is None:
        return []
    params = releases.HASH_PARAMS[row.hash]
    wrapper = compat_hash.flag_hash_wrapper if "cross_layers_blocks" in params else compat_hash.layout_hash_wrapper
    return [PatchSpec(name="compat_hash.tag", module=row.home.worker, owner=None,
                      attr="compute_nixl_compatibility_hash", kind="function", wrapper=wrapper, params=params)]


def _connector_specs(row):
    """What each mechanism patches on NixlConnector."""
    on_connector = dict(module=row.home.connector, owner="NixlConnector")
    if row.mechanism == "layout":
        return [PatchSpec(name="kv_cache_layout.block_outermost", attr="get_required_kvcache_layout",
                          kind="classmethod", wrapper=kv_cache_layout.layout_wrapper, params=LAYOUT_PARAMS,
                          **on_connector),
                PatchSpec(name="page_contiguous.block_rows", attr="register_kv_caches", kind="method",
                          wrapper=page_contiguous.register_wrapper, params=("self", "kv_caches"), **on_connector),
                PatchSpec(name="block_contiguous.heads_outermost", module=KV_CACHE_LAYOUT, owner="KVCacheLayout",
                          attr="is_block_contiguous", kind="property", wrapper=block_contiguous.contiguous_wrapper)]
    if row.mechanism == "native":
        return [PatchSpec(name="cross_layer_preference.native", attr="prefer_cross_layer_blocks", kind="property",
                          wrapper=cross_layer_preference.native_wrapper, **on_connector)]
    if row.prefer == "classvar":  # the base class's ClassVar[bool], overridden on NixlConnector
        prefer = dict(kind="attribute", wrapper=cross_layer_preference.backport_attribute)
    else:  # the base class's property, overridden on NixlConnector
        prefer = dict(kind="property", wrapper=cross_layer_preference.backport_property_wrapper)
    return [PatchSpec(name="cross_layer_preference.backport", attr="prefer_cross_layer_blocks", on_named_class=True,
                      **prefer, **on_connector),
            PatchSpec(name="cross_layer_registration.redirect", attr="register_cross_layers_kv_cache", kind="method",
                      wrapper=cross_layer_registration.redirect_wrapper, params=XL_REGISTER_PARAMS,
                      on_named_class=True, **on_connector)]


def _nixl_key(row):
    """Rows with equal keys have the same NIXL targets (one group)."""
    return (row.mechanism, row.nixl, row.prefer, row.hash, row.hs_hash, row.finished, row.packed)


def _nixl_group(rows):
    row = rows[0]
    return PatchGroup(name="%s-%s" % (row.mechanism, row.release), trigger=row.home.trigger,
                      vllm=releases.span(rows[0], rows[-1]),
                      patches=tuple(_connector_specs(row) + _hash_specs(row) + _worker_specs(row)),
                      precheck=refuse_kvcached)


def _runner_group(rows):
    return PatchGroup(name="runner-v1", trigger=releases.VLLM_CONFIG, vllm=releases.span(rows[0], rows[-1]), nixl=False,
                      patches=(PatchSpec(name="model_runner.force_v1", module=releases.VLLM_CONFIG, owner="VllmConfig",
                                         attr="use_v2_model_runner", kind="property",
                                         wrapper=model_runner.runner_wrapper),))


#: vLLM's KV cache planner (engine core), home of _use_packed_kv_cache_config on 0.24-0.28
KV_CACHE_UTILS = "vllm.v1.core.kv_cache_utils"


def _packed_group(rows):
    """0.24-0.28: the planner's packed multi-group predicate (engine core; not NIXL connector code)."""
    return PatchGroup(name="packed-%s" % rows[0].release, trigger=KV_CACHE_UTILS,
                      vllm=releases.span(rows[0], rows[-1]), nixl=False,
                      patches=(PatchSpec(name="packed_kv_cache_config.plan", module=KV_CACHE_UTILS, owner=None,
                                         attr="_use_packed_kv_cache_config", kind="function",
                                         wrapper=packed_kv_cache_config.predicate_wrapper,
                                         params=("vllm_config", "kv_cache_groups")),))


def _multi_group(rows):
    on_multi = dict(module=releases.MULTI_CONNECTOR, owner="MultiConnector")
    if rows[0].multi == "backport":  # no cross-layer support upstream: the AND of the children, passed on
        patches = (PatchSpec(name="multi_connector.backport", attr="prefer_cross_layer_blocks", kind="attribute",
                             wrapper=multi_connector.backport_attribute, on_named_class=True, **on_multi),
                   PatchSpec(name="multi_connector.register", attr="register_cross_layers_kv_cache", kind="method",
                             wrapper=multi_connector.register_wrapper, params=XL_REGISTER_PARAMS,
                             on_named_class=True, **on_multi))
    else:  # "warn": upstream's AND of the children, explained
        patches = (PatchSpec(name="multi_connector.warn", attr="prefer_cross_layer_blocks", kind="property",
                             wrapper=multi_connector.property_wrapper, **on_multi),)
    return PatchGroup(name="multi-%s" % rows[0].release, trigger=releases.MULTI_CONNECTOR,
                      vllm=releases.span(rows[0], rows[-1]), patches=patches, nixl=False)


#: registered whatever the vLLM release, supported or not (its range is informational)
GUARD = PatchGroup(name="guard", trigger=releases.CONNECTOR_FACTORY, vllm=">=0", nixl=False, always=True,
                   patches=(PatchSpec(name="kv_connector_factory.guard", module=releases.CONNECTOR_FACTORY,
                                      owner="KVConnectorFactory", attr="create_connector", kind="classmethod",
                                      wrapper=kv_connector_factory.factory_wrapper),))


def all_groups():
    """Every patch group, derived from the release table now (a changed table changes them).

    The order is the order the hooks are registered in: the cross-layer-block releases' NIXL
    groups, the runner, packed-groups and MultiConnector groups, the KV-cache-layout releases' NIXL groups, the
    guard."""
    nixl = releases.runs(_nixl_key)
    return ([_nixl_group(rows) for rows in nixl if rows[0].mechanism != "layout"]
            + [_runner_group(rows) for rows in releases.runs(lambda r: r.runner_v1 or None)]
            + [_packed_group(rows) for rows in releases.runs(lambda r: r.packed or None)]
            + [_multi_group(rows) for rows in releases.runs(lambda r: r.multi)]
            + [_nixl_group(rows) for rows in nixl if rows[0].mechanism == "layout"]
            + [GUARD])
