"""The release table (xlkv_autopatch/releases.py) is the one place that says what differs between vLLM
releases; the patch groups, the supported range and the behaviour facts are derived from it.

PINNED_GROUPS is what ``all_groups()`` declared in 0.3.5, before it was derived from the table
(hand-written PatchSpec calls): every group's name, range, trigger and order, and every target, kind,
wrapper and parameter list.  PINNED_FACTS is what ``facts.facts_for`` answered then, from version
thresholds, for releases inside, below and above the supported range (dev builds and release
candidates included).  The derivation keeps both exactly."""

from xlkv_autopatch import facts
from xlkv_autopatch.patches import all_groups

KC = "vllm.distributed.kv_transfer.kv_connector"


def render(groups):
    """One line per group, two per patch spec (target, then wrapper and guards)."""
    out = []
    for g in groups:
        out.append("%s %s on %s%s%s%s" % (g.name, g.vllm, g.trigger.replace(KC, "KC"), " nixl" if g.nixl else "",
                                       " always" if g.always else "",
                                       " precheck=" + g.precheck.__name__ if g.precheck else ""))
        for s in g.patches:
            out.append("  %s %s %s" % (s.name, s.kind, s.target.replace(KC, "KC")))
            out.append("    %s.%s%s%s" % (s.wrapper.__module__.rsplit(".", 1)[-1], s.wrapper.__name__,
                                       " params=" + ",".join(s.params) if s.params is not None else "",
                                       " on_named_class" if s.on_named_class else ""))
    return out


PINNED_GROUPS = [
    "backport-0.12 >=0.12,<0.13 on KC.v1.nixl_connector nixl precheck=refuse_kvcached",
    "  cross_layer_preference.backport attribute KC.v1.nixl_connector:NixlConnector.prefer_cross_layer_blocks",
    "    cross_layer_preference.backport_attribute on_named_class",
    "  cross_layer_registration.redirect method KC.v1.nixl_connector:NixlConnector.register_cross_layers_kv_cache",
    "    cross_layer_registration.redirect_wrapper params=self,kv_cache,attn_backend on_named_class",
    "  handshake.validate method KC.v1.nixl_connector:NixlConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.failed_recv method KC.v1.nixl_connector:NixlConnectorWorker.get_finished",
    "    handshake.finished_wrapper params=self",
    "  block_count.register_kv_caches method KC.v1.nixl_connector:NixlConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "backport-0.13 >=0.13,<0.14 on KC.v1.nixl_connector nixl precheck=refuse_kvcached",
    "  cross_layer_preference.backport attribute KC.v1.nixl_connector:NixlConnector.prefer_cross_layer_blocks",
    "    cross_layer_preference.backport_attribute on_named_class",
    "  cross_layer_registration.redirect method KC.v1.nixl_connector:NixlConnector.register_cross_layers_kv_cache",
    "    cross_layer_registration.redirect_wrapper params=self,kv_cache,attn_backend on_named_class",
    "  handshake.validate method KC.v1.nixl_connector:NixlConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.failed_recv method KC.v1.nixl_connector:NixlConnectorWorker.get_finished",
    "    handshake.finished_wrapper params=self",
    "  handshake.explain_mismatch method KC.v1.nixl_connector:NixlConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl_connector:NixlConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "backport-0.14 >=0.14,<0.16 on KC.v1.nixl_connector nixl precheck=refuse_kvcached",
    "  cross_layer_preference.backport property KC.v1.nixl_connector:NixlConnector.prefer_cross_layer_blocks",
    "    cross_layer_preference.backport_property_wrapper on_named_class",
    "  cross_layer_registration.redirect method KC.v1.nixl_connector:NixlConnector.register_cross_layers_kv_cache",
    "    cross_layer_registration.redirect_wrapper params=self,kv_cache,attn_backend on_named_class",
    "  handshake.validate method KC.v1.nixl_connector:NixlConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.failed_recv method KC.v1.nixl_connector:NixlConnectorWorker.get_finished",
    "    handshake.finished_wrapper params=self",
    "  handshake.explain_mismatch method KC.v1.nixl_connector:NixlConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl_connector:NixlConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "native-0.16 >=0.16,<0.20 on KC.v1.nixl_connector nixl precheck=refuse_kvcached",
    "  cross_layer_preference.native property KC.v1.nixl_connector:NixlConnector.prefer_cross_layer_blocks",
    "    cross_layer_preference.native_wrapper",
    "  compat_hash.tag function KC.v1.nixl_connector:compute_nixl_compatibility_hash",
    "    compat_hash.flag_hash_wrapper params=vllm_config,attn_backend_name,cross_layers_blocks",
    "  handshake.validate method KC.v1.nixl_connector:NixlConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.failed_recv method KC.v1.nixl_connector:NixlConnectorWorker.get_finished",
    "    handshake.finished_wrapper params=self",
    "  handshake.explain_mismatch method KC.v1.nixl_connector:NixlConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl_connector:NixlConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "native-0.20 >=0.20,<0.24 on KC.v1.nixl nixl precheck=refuse_kvcached",
    "  cross_layer_preference.native property KC.v1.nixl.connector:NixlConnector.prefer_cross_layer_blocks",
    "    cross_layer_preference.native_wrapper",
    "  compat_hash.tag function KC.v1.nixl.worker:compute_nixl_compatibility_hash",
    "    compat_hash.flag_hash_wrapper params=vllm_config,attn_backend_name,cross_layers_blocks",
    "  handshake.validate method KC.v1.nixl.worker:NixlConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.failed_recv method KC.v1.nixl.worker:NixlConnectorWorker.get_finished",
    "    handshake.finished_wrapper params=self",
    "  handshake.explain_mismatch method KC.v1.nixl.worker:NixlConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl.worker:NixlConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "native-0.24 >=0.24,<0.28 on KC.v1.nixl nixl precheck=refuse_kvcached",
    "  cross_layer_preference.native property KC.v1.nixl.connector:NixlConnector.prefer_cross_layer_blocks",
    "    cross_layer_preference.native_wrapper",
    "  compat_hash.tag function KC.v1.nixl.base_worker:compute_nixl_compatibility_hash",
    "    compat_hash.flag_hash_wrapper params=vllm_config,attn_backend_name,cross_layers_blocks",
    "  handshake.validate method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.explain_mismatch method KC.v1.nixl.base_worker:NixlBaseConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "native-0.28 >=0.28,<0.29 on KC.v1.nixl nixl precheck=refuse_kvcached",
    "  cross_layer_preference.native property KC.v1.nixl.connector:NixlConnector.prefer_cross_layer_blocks",
    "    cross_layer_preference.native_wrapper",
    "  compat_hash.tag function KC.v1.nixl.base_worker:compute_nixl_compatibility_hash",
    "    compat_hash.flag_hash_wrapper params=vllm_config,attn_backend_name,cross_layers_blocks,transfer_mode",
    "  handshake.validate method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.explain_mismatch method KC.v1.nixl.base_worker:NixlBaseConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "runner-v1 >=0.22,<0.29 on vllm.config.vllm",
    "  model_runner.force_v1 property vllm.config.vllm:VllmConfig.use_v2_model_runner",
    "    model_runner.runner_wrapper",
    "multi-0.12 >=0.12,<0.14 on KC.v1.multi_connector",
    "  multi_connector.backport attribute KC.v1.multi_connector:MultiConnector.prefer_cross_layer_blocks",
    "    multi_connector.backport_attribute on_named_class",
    "  multi_connector.register method KC.v1.multi_connector:MultiConnector.register_cross_layers_kv_cache",
    "    multi_connector.register_wrapper params=self,kv_cache,attn_backend on_named_class",
    "multi-0.14 >=0.14,<0.29 on KC.v1.multi_connector",
    "  multi_connector.warn property KC.v1.multi_connector:MultiConnector.prefer_cross_layer_blocks",
    "    multi_connector.property_wrapper",
    "layout-0.29 >=0.29,<0.34 on KC.v1.nixl nixl precheck=refuse_kvcached",
    "  kv_cache_layout.block_outermost classmethod KC.v1.nixl.connector:NixlConnector.get_required_kvcache_layout",
    "    kv_cache_layout.layout_wrapper params=cls,vllm_config",
    "  compat_hash.tag function KC.v1.nixl.base_worker:compute_nixl_compatibility_hash",
    "    compat_hash.layout_hash_wrapper params=vllm_config,attn_backend_name,transfer_mode",
    "  handshake.validate method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.explain_mismatch method KC.v1.nixl.base_worker:NixlBaseConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "guard >=0 on KC.factory always",
    "  kv_connector_factory.guard classmethod KC.factory:KVConnectorFactory.create_connector",
    "    kv_connector_factory.factory_wrapper",
]


def test_derived_groups_are_the_hand_written_ones():
    assert render(all_groups()) == PINNED_GROUPS


B16 = ("FLASH_ATTN", "FLASHINFER")
B20 = B16 + ("TRITON_ATTN",)
PINNED_FACT_FIELDS = ('has_compat_hash', 'budget_block_count', 'kv_cache_layouts', 'fa_heads_outermost', 'cross_layer_backends', 'failed_recv_looks_up_engine')
PINNED_FACTS = {
    '0': (False, False, False, True, B16, True),
    '0.11.2': (False, False, False, True, B16, True),
    '0.12.0': (False, False, False, True, B16, True),
    '0.13.0': (True, False, False, True, B16, True),
    '0.14.1': (True, False, False, True, B16, True),
    '0.15.1': (True, False, False, True, B16, True),
    '0.16.0': (True, False, False, True, B16, True),
    '0.17.1': (True, False, False, True, B16, True),
    '0.18.0': (True, True, False, True, B16, True),
    '0.19.1': (True, True, False, True, B16, True),
    '0.20.0': (True, True, False, True, B20, True),
    '0.21.0': (True, True, False, True, B20, True),
    '0.22.0': (True, True, False, True, B20, False),
    '0.22.0.dev5': (True, True, False, True, B20, True),
    '0.23.0': (True, True, False, False, B20, False),
    '0.24.0': (True, True, False, False, B20, False),
    '0.24.0.dev5': (True, True, False, False, B20, False),
    '0.25.1': (True, True, False, False, B20, False),
    '0.26.0': (True, True, False, True, B20, False),
    '0.27.1': (True, True, False, True, B20, False),
    '0.28.0': (True, True, False, True, B20, False),
    '0.29.0': (True, True, True, False, B20, False),
    '0.30.0': (True, True, True, False, B20, False),
    '0.31.0': (True, True, True, False, B20, False),
    '0.32.0': (True, True, True, False, B20, False),
    '0.33.0': (True, True, True, False, B20, False),
    '0.33.0rc1': (True, True, True, False, B20, False),
    '0.34.0': (True, True, True, False, B20, False),
    '1.0.0': (True, True, True, False, B20, False),
}


def test_facts_are_the_pinned_ones():
    fields = tuple(f for f in facts.ReleaseFacts.__dataclass_fields__ if f != "release")
    assert fields == PINNED_FACT_FIELDS
    got = {v: tuple(getattr(facts.facts_for(v), f) for f in fields) for v in PINNED_FACTS}
    assert got == PINNED_FACTS


def test_supported_range_is_the_pinned_one():
    from xlkv_autopatch import registry

    assert registry.REGISTRY.supported == ">=0.12,<0.34"
