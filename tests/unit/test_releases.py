"""The release table (xlkv_autopatch/releases.py) is the one place that says what differs between vLLM
releases; the patch groups, the supported range and the behaviour facts are derived from it.

PINNED_GROUPS is what ``all_groups()`` declared in 0.3.5, before it was derived from the table
(hand-written PatchSpec calls): every group's name, range, trigger and order, and every target, kind,
wrapper and parameter list (0.3.12's handoff groups were pinned too, until 0.4.0 removed them).  PINNED_FACTS is what ``facts.facts_for`` answered then, from version
thresholds, for releases inside, below and above the supported range (dev builds and release
candidates included).  The derivation keeps both exactly."""

import ast
import os
import re
import sys
from dataclasses import replace

import pytest

from xlkv_autopatch import facts, releases
from xlkv_autopatch._version import __version__
from xlkv_autopatch.errors import XlkvUnsupportedVersion
from xlkv_autopatch.patches import all_groups


# a docs renderer outside the package (it ships in no wheel), imported from the checkout's tools/ as
# test_measurement_figures.py imports docfigures
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import catalogue  # noqa: E402

KC = "vllm.distributed.kv_transfer.kv_connector"


def render(groups):
    """One line per group, two per patch spec (target, then wrapper and guards)."""
    out = []
    for g in groups:
        out.append("%s %s on %s%s%s%s" % (g.name, g.vllm, g.trigger.replace(KC, "KC"), " nixl" if g.nixl else "",
                                       " always" if g.always else "",
                                       " precheck=" + g.precheck.__name__ if g.precheck else "")
                   + (" knob=" + g.knob if g.knob else ""))
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
    "  packed_kv_cache_config.register method KC.v1.nixl.base_worker:NixlBaseConnectorWorker._register_packed_kv_cache",
    "    packed_kv_cache_config.register_wrapper params=self,...",
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
    "  packed_kv_cache_config.register method KC.v1.nixl.base_worker:NixlBaseConnectorWorker._register_packed_kv_cache",
    "    packed_kv_cache_config.register_wrapper params=self,...",
    "runner-v1 >=0.22,<0.29 on vllm.config.vllm",
    "  model_runner.force_v1 property vllm.config.vllm:VllmConfig.use_v2_model_runner",
    "    model_runner.runner_wrapper",
    "packed-0.24 >=0.24,<0.29 on vllm.v1.core.kv_cache_utils",
    "  packed_kv_cache_config.plan function vllm.v1.core.kv_cache_utils:_use_packed_kv_cache_config",
    "    packed_kv_cache_config.predicate_wrapper params=vllm_config,kv_cache_groups",
    "multi-0.12 >=0.12,<0.14 on KC.v1.multi_connector",
    "  multi_connector.backport attribute KC.v1.multi_connector:MultiConnector.prefer_cross_layer_blocks",
    "    multi_connector.backport_attribute on_named_class",
    "  multi_connector.register method KC.v1.multi_connector:MultiConnector.register_cross_layers_kv_cache",
    "    multi_connector.register_wrapper params=self,kv_cache,attn_backend on_named_class",
    "multi-0.14 >=0.14,<0.29 on KC.v1.multi_connector",
    "  multi_connector.warn property KC.v1.multi_connector:MultiConnector.prefer_cross_layer_blocks",
    "    multi_connector.property_wrapper",
    "detok-0.17 >=0.17,<0.34 on vllm.v1.engine.detokenizer knob=XLKV_DETOK_TAIL",
    "  incremental_detokenizer.tail method vllm.v1.engine.detokenizer:FastIncrementalDetokenizer.__init__",
    "    incremental_detokenizer.init_wrapper params=self,tokenizer,request",
    "layout-0.29 >=0.29,<0.34 on KC.v1.nixl nixl precheck=refuse_kvcached",
    "  kv_cache_layout.block_outermost classmethod KC.v1.nixl.connector:NixlConnector.get_required_kvcache_layout",
    "    kv_cache_layout.layout_wrapper params=cls,vllm_config",
    "  page_contiguous.block_rows method KC.v1.nixl.connector:NixlConnector.register_kv_caches",
    "    page_contiguous.register_wrapper params=self,kv_caches",
    "  block_contiguous.heads_outermost property vllm.v1.kv_cache_layout:KVCacheLayout.is_block_contiguous",
    "    block_contiguous.contiguous_wrapper",
    "  compat_hash.tag function KC.v1.nixl.base_worker:compute_nixl_compatibility_hash",
    "    compat_hash.layout_hash_wrapper params=vllm_config,attn_backend_name,transfer_mode",
    "  handshake.validate method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.add_remote_agent",
    "    handshake.validate_wrapper params=self,nixl_agent_meta,remote_tp_rank,remote_tp_size,...",
    "  handshake.explain_mismatch method KC.v1.nixl.base_worker:NixlBaseConnectorWorker._nixl_handshake",
    "    handshake.handshake_wrapper params=self,host,port,remote_tp_size,...",
    "  block_count.register_kv_caches method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.register_kv_caches",
    "    block_count.register_wrapper params=self,kv_caches",
    "  block_size_restage.receive method KC.v1.nixl.base_worker:NixlBaseConnectorWorker.post_process_device_kv_on_receive",
    "    block_size_restage.receive_wrapper params=self,block_size_ratio,block_ids_list,convert",
    "guard >=0 on KC.factory always",
    "  kv_connector_factory.guard classmethod KC.factory:KVConnectorFactory.create_connector",
    "    kv_connector_factory.factory_wrapper",
]


def test_derived_groups_are_the_hand_written_ones():
    assert render(all_groups()) == PINNED_GROUPS


B16 = ("FLASH_ATTN", "FLASHINFER")
B20 = B16 + ("TRITON_ATTN",)
LAYOUT = 'mechanism == "layout"'
#: the facts pinned then, by the names they have now (the boolean kv_cache_layouts is mechanism == "layout")
PINNED_FACT_FIELDS = ("has_compat_hash", "budget_block_count", LAYOUT, "fa_heads_outermost",
                      "cross_layer_backends", "failed_recv_looks_up_engine", "kv_split_regions", "packed_groups",
                      "mla_cross_layer_backends", "connector_turns_hma_off", "detokenizer_primes_prompt")
MLA = ("FLASH_ATTN_MLA", "TRITON_MLA", "FLASHMLA")
PINNED_FACTS = {
    "0": (False, False, False, True, B16, True, True, False, (), True, False),
    "0.11.2": (False, False, False, True, B16, True, True, False, (), True, False),
    "0.12.0": (False, False, False, True, B16, True, True, False, (), True, False),
    "0.13.0": (True, False, False, True, B16, True, True, False, (), True, False),
    "0.14.1": (True, False, False, True, B16, True, True, False, (), True, False),
    "0.15.1": (True, False, False, True, B16, True, True, False, (), True, False),
    "0.16.0": (True, False, False, True, B16, True, True, False, (), True, False),
    "0.17.1": (True, False, False, True, B16, True, True, False, (), True, True),
    "0.18.0": (True, True, False, True, B16, True, True, False, (), True, True),
    "0.19.1": (True, True, False, True, B16, True, True, False, (), True, True),
    "0.20.0": (True, True, False, True, B20, True, True, False, (), True, True),
    "0.21.0": (True, True, False, True, B20, True, True, False, (), True, True),
    "0.22.0": (True, True, False, True, B20, False, True, False, (), False, True),
    "0.22.0.dev5": (True, True, False, True, B20, True, True, False, (), True, True),
    "0.23.0": (True, True, False, False, B20, False, True, False, (), False, True),
    "0.24.0": (True, True, False, False, B20, False, True, True, (), False, True),
    "0.24.0.dev5": (True, True, False, False, B20, False, True, False, (), False, True),
    "0.25.1": (True, True, False, False, B20, False, True, True, (), False, True),
    "0.26.0": (True, True, False, True, B20, False, False, True, MLA, False, True),
    "0.27.1": (True, True, False, True, B20, False, False, True, MLA, False, True),
    "0.28.0": (True, True, False, True, B20, False, False, True, MLA, False, True),
    "0.29.0": (True, True, True, False, B20, False, False, False, (), False, True),
    "0.30.0": (True, True, True, False, B20, False, False, False, (), False, True),
    "0.31.0": (True, True, True, False, B20, False, False, False, (), False, True),
    "0.32.0": (True, True, True, False, B20, False, False, False, (), False, True),
    "0.33.0": (True, True, True, False, B20, False, False, False, (), False, True),
    "0.33.0rc1": (True, True, True, False, B20, False, False, False, (), False, True),
    "0.34.0": (True, True, True, False, B20, False, False, False, (), False, True),
    "1.0.0": (True, True, True, False, B20, False, False, False, (), False, True),
}


def test_facts_are_the_pinned_ones():
    def fact(f, name):
        return f.mechanism == "layout" if name == LAYOUT else getattr(f, name)

    fields = PINNED_FACT_FIELDS
    assert set(fields) - {LAYOUT} <= set(facts.ReleaseFacts.__dataclass_fields__)
    got = {v: tuple(fact(facts.facts_for(v), f) for f in fields) for v in PINNED_FACTS}
    assert got == PINNED_FACTS


def test_supported_range_is_the_pinned_one():
    from xlkv_autopatch import registry

    assert registry.REGISTRY.supported == ">=0.12,<0.34"


# ---------------------------------------------------------------------- open ranges in docstrings


def _docstrings():
    """(where, text) of every module, class and function docstring of the package."""
    pkg = os.path.dirname(os.path.abspath(releases.__file__))
    for folder, _, names in os.walk(pkg):
        for fname in sorted(names):
            if not fname.endswith(".py"):
                continue
            path = os.path.join(folder, fname)
            tree = ast.parse(open(path).read())
            for node in [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))]:
                doc = ast.get_docstring(node)
                if doc:
                    yield "%s:%s" % (os.path.relpath(path, pkg), getattr(node, "name", "module")), doc


def closed_at(release, text):
    """Ranges in ``text`` that end at ``release`` ("0.12-0.33", "0.29–0.33", "up to 0.33", "through 0.33")."""
    return re.findall(r"(?:\d+\.\d+\s*[-–]\s*|(?:up to|through|until) )%s(?![\d.]*\d)" % re.escape(release), text)


def test_docstrings_use_open_ranges_for_the_last_supported_release():
    """A docstring saying "0.29-0.33" goes stale silently when 0.34 is added; "0.29+" does not."""
    last = releases.RELEASES[-1].release
    bad = [(where, closed_at(last, doc)) for where, doc in _docstrings() if closed_at(last, doc)]
    assert bad == [], "write these ranges open (%s+: the release table says where they end): %s" % (last, bad)


def test_the_open_range_check_sees_a_closed_range():
    assert closed_at("0.33", "vLLM versions\n    0.29-0.33.") == ["0.29-0.33"]
    assert closed_at("0.33", "0.12–0.33 and up to 0.33") == ["0.12–0.33", "up to 0.33"]
    assert closed_at("0.33", "0.29+; 0.33 appends remote_dcp_size; 0.12-0.333; 0.33.0rc1") == []


# ---------------------------------------------------------------------- a new release is one row


@pytest.fixture
def with_0_34(monkeypatch):
    """The release table with one more row, a 0.34 whose code is 0.33's: the only edit."""
    monkeypatch.setattr(releases, "RELEASES", releases.RELEASES + (replace(releases.RELEASES[-1], release="0.34"),))
    facts.reset()
    yield
    facts.reset()


def _targets(groups):
    return [(g.name, g.trigger, [(s.name, s.target, s.kind, s.wrapper, s.params) for s in g.patches]) for g in groups]


def test_a_row_for_0_34_is_all_it_takes(with_0_34, monkeypatch, tmp_path, capsys):
    from xlkv_autopatch import __main__ as cli, registry

    # the supported range grows, for the refusal and for status
    assert releases.supported_range() == ">=0.12,<0.35" == registry.REGISTRY.supported
    reg = registry.Registry(all_groups)
    reg.check_version("0.34.0")
    reg.check_version("0.34.1")
    with pytest.raises(XlkvUnsupportedVersion, match=r"vLLM 0.35.0 is not supported \(supported: >=0.12,<0.35\)"):
        reg.check_version("0.35.0")
    # the same patch groups as 0.33 (one range now reaching 0.34), the same behaviour facts
    assert _targets(reg.groups_for("0.34.0")) == _targets(reg.groups_for("0.33.0"))
    assert [g.vllm for g in reg.groups_for("0.34.0")] == [">=0.17,<0.35", ">=0.29,<0.35", ">=0"]
    assert replace(facts.facts_for("0.34.0"), release=None) == replace(facts.facts_for("0.33.0"), release=None)
    # everything else, 0.12-0.33, stays as pinned but for that one range
    assert render(all_groups()) == [line.replace("layout-0.29 >=0.29,<0.34", "layout-0.29 >=0.29,<0.35")
                                    .replace("detok-0.17 >=0.17,<0.34", "detok-0.17 >=0.17,<0.35")
                                    for line in PINNED_GROUPS]
    # status, on a stand-in vLLM 0.34.0 (package metadata only)
    meta = tmp_path / "vllm-0.34.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n")
    # and the shim's own metadata with its plugin entry point, as a pip install leaves it: status
    # reports "no activation path" (a PROBLEM, exit 1) in a plain checkout run through PYTHONPATH,
    # and this test is about 0.34, not about how the shim was installed (importlib.metadata reads
    # the first distribution of a name on sys.path, so an installed copy changes nothing either)
    from xlkv_autopatch import status_report
    shim = tmp_path / ("xlkv_autopatch-%s.dist-info" % __version__)
    shim.mkdir()
    (shim / "METADATA").write_text("Metadata-Version: 2.1\nName: xlkv_autopatch\nVersion: %s\n" % __version__)
    (shim / "entry_points.txt").write_text("[%s]\n%s = xlkv_autopatch.plugin:register\n"
                                           % (status_report.PLUGIN_GROUP, status_report.PLUGIN_NAME))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert status_report.plugin_entry_points() == ["xlkv_autopatch = xlkv_autopatch.plugin:register"]
    for name in ("XLKV_VLLM_VERSION", "XLKV_COALESCE", "XLKV_STRICT", "ENABLE_KVCACHED", "KVCACHED_AUTOPATCH",
                 "VLLM_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ENABLE_XLKV", "true")
    rc = cli.main(["status", "--no-resolve"])
    text = capsys.readouterr().out
    assert rc == 0 and "vLLM: 0.34.0  [supported: >=0.12,<0.35]" in text, text
    assert "patch set layout-0.29 (vLLM >=0.29,<0.35, on import of %s.nixl):" % releases.V1 in text
    # the docs' catalogue
    table = catalogue.render()
    assert "| `kv_cache_layout` | `get_required_kvcache_layout` | 0.29–0.34 |" in table
    assert "| `handshake` | `add_remote_agent` | 0.12–0.34 |" in table
    assert "`v1.nixl.base_worker` 0.24–0.34" in table and "0.33" not in table
    mechanisms = catalogue.render_mechanisms()
    assert "| 0.11.x and older, 0.35+ | — |" in mechanisms and "| 0.29–0.34 | KV-cache layout |" in mechanisms
    # no docstring names 0.33 as the end of a range, so none needs an edit
    assert [where for where, doc in _docstrings() if closed_at("0.33", doc)] == []


def test_without_the_row_0_34_is_refused():
    from xlkv_autopatch import registry

    with pytest.raises(XlkvUnsupportedVersion, match="vLLM 0.34.0 is not supported"):
        registry.Registry(all_groups).check_version("0.34.0")


def test_the_table_is_consecutive_minor_releases():
    """span() and runs() read neighbouring rows as neighbouring releases."""
    minors = [releases.minor(r.release) for r in releases.RELEASES]
    assert minors == [(0, m) for m in range(minors[0][1], minors[0][1] + len(minors))]


@pytest.mark.parametrize("cell, value", [("mechanism", "forked"), ("nixl", "elsewhere"), ("has_compat_hash", "maybe")])
def test_a_row_with_an_unknown_value_is_refused(cell, value):
    header, first = releases.TABLE.strip().splitlines()[:2]
    cells = first.split()
    cells[header.split().index(cell)] = value
    with pytest.raises(ValueError, match=value):
        releases.parse_table(header + "\n" + " ".join(cells))
