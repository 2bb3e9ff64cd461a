"""page_contiguous.py's check after vLLM's registration: "one region of one row per block" means one
region whose block length IS the block stride.  A single region that covers part of each row (its
length shorter than the stride: one layer's page, or K without V) moves part of every block; a
worker that published "one region per row" in its hash, or that lets vLLM slice its rows by heads,
must not pass with it.  Stand-in workers and vLLM-shaped views; tests/real runs vLLM's own code."""

import types

import pytest

from xlkv_autopatch import facts
from xlkv_autopatch.errors import XlkvRegistrationError
from xlkv_autopatch.patches import _state, page_contiguous


@pytest.fixture(autouse=True)
def release_0_33(monkeypatch):
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.33.0")
    monkeypatch.setattr(_state, "KNOWN", {})
    monkeypatch.setattr(_state, "_stock_reasons", [])
    facts.reset()
    yield
    facts.reset()


def registered(regions, lens, strides):
    return types.SimpleNamespace(num_regions=regions, block_len_per_layer=lens, block_stride_per_layer=strides)


def test_one_region_is_one_row_only_where_its_length_is_the_block_stride():
    assert page_contiguous._one_row_region(registered(1, [4096], [4096])) == (4096, None)
    row, why = page_contiguous._one_row_region(registered(1, [2048], [4096]))  # half of each row
    assert row is None and why == "1 region(s) (block lengths [2048], strides [4096])"
    row, why = page_contiguous._one_row_region(registered(4, [1024] * 4, [4096] * 4))  # one region per layer
    assert row is None and why.startswith("4 region(s)")
    assert page_contiguous._one_row_region(registered(1, [4096, 4096], [4096, 4096]))[0] is None
    assert page_contiguous._one_row_region(types.SimpleNamespace())[0] is None  # nothing registered


def _cfg(heads):
    model = types.SimpleNamespace(is_hybrid=False, use_mla=False, hf_text_config=types.SimpleNamespace(),
                                  get_num_kv_heads=lambda parallel: heads)
    return types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_buffer_device="cuda"),
                                 model_config=model, parallel_config=types.SimpleNamespace(pipeline_parallel_size=1))


def _bhlnc(torch, heads, layers=4, blocks=8, tokens=16, content=32):
    """vLLM 0.33's BHLNC views: per layer [blocks, heads, tokens, content], the heads L x N x C apart."""
    page = tokens * content
    row = layers * page * heads
    buf = torch.zeros(blocks * row, dtype=torch.float32)
    return {"model.layers.%d.self_attn.attn" % i: buf.as_strided((blocks, heads, tokens, content),
                                                                  (row, layers * page, content, 1), i * page)
            for i in range(layers)}, row * 4


def _worker(heads):
    return types.SimpleNamespace(kv_cache_layout="BHLNC", use_mla=False, _has_mamba=False, use_host_buffer=False,
                                 vllm_config=_cfg(heads))


@pytest.mark.parametrize("heads", [1, 2])
def test_a_region_shorter_than_the_block_stride_is_refused_or_not_sliced(heads):
    """One KV head per rank (xlkv hands vLLM whole-row views): refused, since the hash says one region per
    row.  Two heads (vLLM's own whole-row branch): the rows are not marked for head slicing."""
    torch = pytest.importorskip("torch")
    kv, row = _bhlnc(torch, heads)

    def vllm_registers(length):
        def register(kv_caches):
            w.num_regions, w.block_len_per_layer, w.block_stride_per_layer = 1, [length], [row]
            return "registered"
        return register

    w = _worker(heads)
    conn = types.SimpleNamespace(connector_worker=w)
    assert page_contiguous.register_wrapper(vllm_registers(row), conn, (kv,), {}) == "registered"
    assert _state.heads_outermost(w) == (True, None)  # a whole row per block: what handshake.py may slice

    w = _worker(heads)
    conn = types.SimpleNamespace(connector_worker=w)
    if heads == 1:
        with pytest.raises(XlkvRegistrationError, match=r"as 1 region\(s\) \(block lengths \[%d\], strides \[%d\]\), "
                                                         r"not one region of one row per block" % (row // 2, row)):
            page_contiguous.register_wrapper(vllm_registers(row // 2), conn, (kv,), {})
    else:
        assert page_contiguous.register_wrapper(vllm_registers(row // 2), conn, (kv,), {}) == "registered"
        sliceable, why = _state.heads_outermost(w)
        assert not sliceable and why and "not one region per block row" in why and "strides [%d]" % row in why, (
            "rows registered as one region shorter than the block stride were marked (sliceable, why) = %r"
            % ((sliceable, why),))
