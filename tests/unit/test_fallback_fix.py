"""A start-up fallback that one setting undoes names that setting: the WARNING (and the XLKV_STRICT error) for an
attention kernel block smaller than the KV block (vLLM 0.29+) ends with the --block-size that keeps xlkv's layout,
and the reason remembered for the handshake stays the bare cause (layout.kernel_split_of parses it)."""

import sys
import types

import pytest

from xlkv_autopatch import facts, layout, logs
from xlkv_autopatch.errors import XlkvError
from xlkv_autopatch.patches import _state, kv_cache_layout


def _cfg(buffer="cuda"):
    model = types.SimpleNamespace(is_hybrid=False, use_mla=False, hf_text_config=types.SimpleNamespace(),
                                  get_num_kv_heads=lambda parallel: 2)
    return types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_buffer_device=buffer),
                                 model_config=model, parallel_config=types.SimpleNamespace(pipeline_parallel_size=1),
                                 cache_config=types.SimpleNamespace(block_size=32))


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.33.0")
    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
    monkeypatch.delenv("XLKV_STRICT", raising=False)
    monkeypatch.setattr(_state, "_stock_reasons", [])
    monkeypatch.setattr(logs, "_seen", set())
    facts.reset()
    yield
    facts.reset()


def _vllm_picks_a_kernel_block(monkeypatch, kernel):
    """Stand-ins for the two vLLM functions kv_cache_layout._kernel_split asks (the attention backends and
    vLLM's choice of a common kernel block), in sys.modules with their parent packages."""
    names = ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer", "vllm.distributed.kv_transfer.kv_connector",
             "vllm.distributed.kv_transfer.kv_connector.utils", "vllm.v1", "vllm.v1.worker", "vllm.v1.worker.utils"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm.distributed.kv_transfer.kv_connector.utils"].get_current_attn_backends = lambda cfg: ["FA"]
    sys.modules["vllm.v1.worker.utils"].select_common_block_size = lambda block_size, backends: kernel


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_smaller_kernel_block_warns_with_the_block_size_that_works(monkeypatch, caplog):
    reason = layout.kernel_split_reason(16, 32)
    _vllm_picks_a_kernel_block(monkeypatch, 16)
    cls = type("NixlPullConnector", (), {})
    with caplog.at_level("INFO", logger="vllm.xlkv_autopatch"):
        assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (_cfg(),), {}) == "LBHNC"
    [warning] = _warnings(caplog)
    assert warning.startswith("xlkv_autopatch: ENABLE_XLKV is set but the stock per-layer KV layout is kept: "
                              + reason), warning
    assert warning.endswith(". To run xlkv's layout: set --block-size 16 (the attention kernel block) on prefill "
                            "and decode"), warning
    # the handshake still reads the bare cause
    assert _state.stock_reasons() == [reason] and layout.kernel_split_of(_state.stock_reasons()[0]) == (16, 32)
    monkeypatch.setenv("XLKV_STRICT", "1")
    with pytest.raises(XlkvError, match=r"To run xlkv's layout: set --block-size 16 .*XLKV_STRICT=1 makes this"):
        kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (_cfg(),), {})


def test_a_cause_no_setting_undoes_ends_at_the_cause(monkeypatch, caplog):
    """A model family that keeps the stock layout (Mamba hybrid) gets no "To run xlkv's layout" advice."""
    cls = type("NixlPullConnector", (), {})
    cfg = _cfg()
    cfg.model_config.is_hybrid = True
    with caplog.at_level("INFO", logger="vllm.xlkv_autopatch"):
        assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (cfg,), {}) == "LBHNC"
    [warning] = _warnings(caplog)
    assert "To run xlkv's layout" not in warning, warning
