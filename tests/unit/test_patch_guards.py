"""The safety guards of the patch wrappers, on small stand-in objects (narrow unit tests of the
glue's decisions; the real checks against vLLM are in tests/real)."""

import types

import pytest

from xlkv_autopatch import facts, layout, logs
from xlkv_autopatch.errors import XlkvError, XlkvMismatchError, XlkvRegistrationError
from xlkv_autopatch.patches import (_state, block_count, compat_hash, cross_layer_preference, handshake,
                                    kv_cache_layout, model_runner, multi_connector)
from xlkv_autopatch.patches._kvcached import refuse_kvcached


def ok(*args, **kwargs):
    return "original ran"


def worker(**kw):
    base = dict(block_size=16, world_size=1, backend_name="FLASH_ATTN", _xlkv_cross_layer=True,
                block_len_per_layer=[32768], num_blocks=64)
    base.update(kw)
    return types.SimpleNamespace(**base)


def meta(**kw):
    base = dict(block_size=16, engine_id="prefill-0", kv_caches_base_addr=[1])
    base.update(kw)
    return types.SimpleNamespace(**base)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test starts with no remembered hashes or stock-layout reasons, facts re-read."""
    monkeypatch.setattr(_state, "KNOWN", {})
    monkeypatch.setattr(_state, "_stock_reasons", [])
    monkeypatch.setattr(_state, "_preferred", [])
    facts.reset()
    yield
    facts.reset()


@pytest.fixture
def release(monkeypatch):
    def set_(v):
        monkeypatch.setenv("XLKV_VLLM_VERSION", v)
        facts.reset()
    set_("0.21.0")
    return set_


def test_block_size_mismatch_refused(release):
    with pytest.raises(XlkvMismatchError, match="registers 32-token blocks with NIXL, this engine 16-token KV blocks"):
        handshake.validate_wrapper(ok, worker(), (meta(block_size=32), 0, 1), {})
    # the same --block-size (32) on both sides, a 16-token attention kernel block here: named as such
    here = worker(vllm_config=types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=32)))
    with pytest.raises(XlkvMismatchError) as e:
        handshake.validate_wrapper(ok, here, (meta(block_size=32), 0, 1), {})
    assert "KV blocks of 32 tokens (--block-size), split by the attention kernel into 16-token blocks" in str(e.value)
    assert "attention kernel block differs" in str(e.value) and "same attention backend" in str(e.value)
    assert handshake.validate_wrapper(ok, worker(), (meta(), 0, 1), {}) == "original ran"


def test_different_block_sizes_served_where_decode_blocks_hold_whole_prefill_blocks(release):
    """vLLM 0.29+: xlkv's heads-outermost rows whose receive restage is attached read a peer whose blocks
    divide this engine's (decode TP >= prefill TP); every other pairing is refused naming why."""
    release("0.33.0")
    rows = dict(_xlkv_cross_layer=False, kv_cache_layout="BHLNC", block_len_per_layer=[1], block_size=32)
    remote = dict(kv_caches_base_addr=[1], kv_cache_layout="BHLNC")
    w = worker(**rows)
    _state.mark_heads_outermost(w)
    with pytest.raises(XlkvMismatchError, match="receive restage .* is not attached"):
        handshake.validate_wrapper(ok, w, (meta(block_size=16, **remote), 0, 1), {})
    _state.mark_restages(w)
    for remote_bs in (16, 8):  # 2 and 4 prefill blocks per decode block
        assert handshake.validate_wrapper(ok, w, (meta(block_size=remote_bs, **remote), 0, 1), {}) == "original ran"
    with pytest.raises(XlkvMismatchError, match="refuses 32-token blocks here facing 64-token blocks there"):
        handshake.validate_wrapper(ok, w, (meta(block_size=64, **remote), 0, 1), {})
    with pytest.raises(XlkvMismatchError, match="prefill TP 2 > decode TP 1"):
        handshake.validate_wrapper(ok, w, (meta(block_size=16, **remote), 0, 2), {})
    two = worker(world_size=2, **rows)  # decode TP 2 from prefill TP 1: served, the heads sliced
    _state.mark_heads_outermost(two)
    _state.mark_restages(two)
    assert handshake.validate_wrapper(ok, two, (meta(block_size=16, **remote), 0, 1), {}) == "original ran"
    padded = worker(**rows)
    _state.mark_heads_outermost(padded, "the row is padded")
    _state.mark_restages(padded)
    with pytest.raises(XlkvMismatchError, match="one region each whose KV heads tile them: the row is padded"):
        handshake.validate_wrapper(ok, padded, (meta(block_size=16, **remote), 0, 1), {})
    window = types.SimpleNamespace(kv_cache_spec=types.SimpleNamespace(sliding_window=128))
    full = types.SimpleNamespace(kv_cache_spec=types.SimpleNamespace(sliding_window=None))
    hybrid = worker(kv_cache_config=types.SimpleNamespace(kv_cache_groups=[window, full]), **rows)
    _state.mark_heads_outermost(hybrid)
    _state.mark_restages(hybrid)
    with pytest.raises(XlkvMismatchError, match="a sliding-window KV cache group") as e:
        handshake.validate_wrapper(ok, hybrid, (meta(block_size=16, **remote), 0, 1), {})
    assert "multiple" not in str(e.value)  # the direction is served: the fix is the same block size
    with pytest.raises(XlkvMismatchError, match="Fix: decode blocks a multiple of prefill blocks, the same"):
        handshake.validate_wrapper(ok, w, (meta(block_size=64, **remote), 0, 1), {})
    release("0.26.0")  # a cross-layer block of 0.12-0.28: refused whatever the sizes
    with pytest.raises(XlkvMismatchError, match="cannot be re-split into the peer's token ranges"):
        handshake.validate_wrapper(ok, worker(block_size=32), (meta(block_size=16), 0, 1), {})


def test_stock_worker_is_not_checked(release):
    w = worker(_xlkv_cross_layer=False)
    assert handshake.validate_wrapper(ok, w, (meta(block_size=32), 0, 1), {}) == "original ran"


def test_heterogeneous_tp(release):
    # FlashAttention cross-layer block: heads outermost, sliceable
    assert handshake.validate_wrapper(ok, worker(world_size=2), (meta(), 0, 1), {}) == "original ran"
    with pytest.raises(XlkvMismatchError, match="blocks-first"):
        handshake.validate_wrapper(ok, worker(world_size=2, backend_name="FLASHINFER"), (meta(), 0, 1), {})
    release("0.24.0")  # FA is treated as blocks-first in 0.23-0.25 transfers
    with pytest.raises(XlkvMismatchError, match="blocks-first"):
        handshake.validate_wrapper(ok, worker(world_size=2), (meta(), 0, 1), {})
    release("0.26.0")
    assert handshake.validate_wrapper(ok, worker(world_size=2), (meta(), 0, 1), {}) == "original ran"
    # MLA's cross-layer latent tensor (0.26-0.28): replicated on every rank, served at any TP pairing
    assert handshake.validate_wrapper(ok, worker(world_size=2, backend_name="TRITON_MLA", use_mla=True),
                                      (meta(), 0, 1), {}) == "original ran"
    release("0.33.0")
    # token-major rows (vLLM's own BLNHC, set explicitly beside the flag): refused, as vLLM would
    w = worker(world_size=2, _xlkv_cross_layer=False, kv_cache_layout="BLNHC")
    with pytest.raises(XlkvMismatchError, match="token-major block-outermost rows"):
        handshake.validate_wrapper(ok, w, (meta(), 0, 1), {})
    # xlkv's heads-outermost rows that page_contiguous.py checked: served, inside the head-slicing scope
    seen = []

    def original(*a, **k):
        seen.append(_state.head_slicing_now())
        return "original ran"

    h = worker(world_size=2, _xlkv_cross_layer=False, kv_cache_layout="BHLNC", block_len_per_layer=[1])
    _state.mark_heads_outermost(h)
    for remote_tp in (1, 4):  # D > P and P > D
        assert handshake.validate_wrapper(original, h, (meta(kv_caches_base_addr=[1], kv_cache_layout="BHLNC"), 0,
                                                        remote_tp), {}) == "original ran"
    assert seen == [True, True] and not _state.head_slicing_now()
    assert handshake.validate_wrapper(original, h, (meta(kv_caches_base_addr=[1], kv_cache_layout="BHLNC"), 0, 2),
                                      {}) == "original ran"
    assert seen[-1] is False  # equal TP: vLLM's own gate is not reached
    # rows whose heads do not tile (padding): refused with that cause
    padded = worker(world_size=2, _xlkv_cross_layer=False, kv_cache_layout="BHLNC", block_len_per_layer=[1])
    _state.mark_heads_outermost(padded, "the row is padded")
    with pytest.raises(XlkvMismatchError, match="rows cannot be sliced by heads: the row is padded"):
        handshake.validate_wrapper(ok, padded, (meta(kv_caches_base_addr=[1], kv_cache_layout="BHLNC"), 0, 1), {})
    # MLA (token-major rows, replicated latent cache): vLLM reads one remote rank, nothing sliced
    mla = worker(world_size=2, _xlkv_cross_layer=False, kv_cache_layout="BLNHC", use_mla=True)
    assert handshake.validate_wrapper(ok, mla, (meta(kv_caches_base_addr=[1], kv_cache_layout="BLNHC"), 0, 1),
                                      {}) == "original ran"
    # the same layout name registered per layer on the peer (one KV head per rank without xlkv): refused
    with pytest.raises(XlkvMismatchError, match=r"this engine registered 1 region\(s\) \(KV layout BHLNC\), the remote "
                                                 r"engine 4 \(KV layout BHLNC\)"):
        handshake.validate_wrapper(ok, h, (meta(kv_caches_base_addr=[1] * 4, kv_cache_layout="BHLNC"), 0, 1), {})


def test_block_contiguous_answers_bhlnc_only_inside_the_head_slicing_scope():
    from xlkv_autopatch.patches import block_contiguous

    def member(name):
        return types.SimpleNamespace(name=name)

    def vllm(m):  # vLLM's own test: the last three physical dimensions are H, N, C
        return m.name in ("LBHNC", "BLHNC")

    def ask(name):
        return block_contiguous.contiguous_wrapper(vllm, member(name), (member(name),), {})

    assert [ask(n) for n in ("LBHNC", "BLHNC", "BLNHC", "BHLNC")] == [True, True, False, False]
    with _state.head_slicing():
        assert [ask(n) for n in ("LBHNC", "BLHNC", "BLNHC", "BHLNC", "LBNHC")] == [True, True, False, True, False]
    assert ask("BHLNC") is False


def test_region_layout_compared_without_hash_on_0_12(release):
    release("0.12.0")
    with pytest.raises(XlkvMismatchError, match="ENABLE_XLKV unset there"):
        handshake.validate_wrapper(ok, worker(), (meta(kv_caches_base_addr=list(range(8))), 0, 1), {})
    # the per-layer side (ENABLE_XLKV set, stock layout kept) names the cause too
    stock_side = worker(_xlkv_cross_layer=False, block_len_per_layer=[4096] * 8)
    with pytest.raises(XlkvMismatchError, match=r"this engine registered 8 region\(s\), the remote engine 1; "
                                                 r"vLLM 0.12 compares no compatibility hash"):
        handshake.validate_wrapper(ok, stock_side, (meta(kv_caches_base_addr=[1]), 0, 1), {})
    assert handshake.validate_wrapper(ok, stock_side, (meta(kv_caches_base_addr=list(range(8))), 0, 1), {}) == \
        "original ran"


def test_region_layout_compared_when_the_hash_check_is_off(release):
    """0.13+ with enforce_handshake_compat: false: the layouts are compared before vLLM's own
    block-length assertions (issue: a bare 'must be of shape [2, N, ...]' on 0.21)."""
    off = worker(enforce_compat_hash=False)
    with pytest.raises(XlkvMismatchError) as e:
        handshake.validate_wrapper(ok, off, (meta(kv_caches_base_addr=list(range(8))), 0, 1), {})
    assert "remote engine runs the stock per-layer KV layout (ENABLE_XLKV unset there" in str(e.value)
    assert "enforce_handshake_compat: false" in str(e.value)
    assert handshake.validate_wrapper(ok, off, (meta(kv_caches_base_addr=[1]), 0, 1), {}) == "original ran"
    release("0.33.0")  # the metadata names the layout: a whole-row one is cross-layer
    off = worker(enforce_compat_hash=False, kv_cache_layout="LBHNC", _xlkv_cross_layer=False, block_len_per_layer=[1] * 4)
    with pytest.raises(XlkvMismatchError, match="remote engine runs xlkv's cross-layer KV layout"):
        handshake.validate_wrapper(ok, off, (meta(kv_caches_base_addr=[1] * 4, kv_cache_layout="BLNHC"), 0, 1), {})
    assert handshake.validate_wrapper(ok, off, (meta(kv_caches_base_addr=[1] * 4, kv_cache_layout="LBNHC"), 0, 1),
                                      {}) == "original ran"


def test_hash_mismatch_is_explained(release):
    stock = "1" * 64
    published = _state.remember_hashes(stock, cross_layer=True)
    assert published == layout.tag_hash(stock)

    def failing(*a, **k):
        raise RuntimeError("NIXL compatibility hash mismatch. Local: %s, Remote: %s. Prefill and decode ..."
                           % (published, stock))

    w = types.SimpleNamespace(compat_hash=published, kv_transfer_config=types.SimpleNamespace(kv_role="kv_consumer"))
    with pytest.raises(XlkvMismatchError) as e:
        handshake.handshake_wrapper(failing, w, (), {})
    msg = str(e.value)
    assert "kv_consumer engine runs xlkv's cross-layer" in msg and "ENABLE_XLKV unset there" in msg
    assert "set ENABLE_XLKV=true on BOTH" in msg
    # the remote may have the flag and an explicit layout (0.29+): named among the remote causes
    assert "an explicit VLLM_KV_CACHE_LAYOUT" in msg


def test_hash_mismatch_names_this_engines_own_reason_for_the_stock_layout(release, monkeypatch):
    """Both flagged, VLLM_KV_CACHE_LAYOUT=LBHNC here (0.29+): the refusal says so, not 'set ENABLE_XLKV'."""
    release("0.33.0")
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "LBHNC")
    cls = type("NixlPullConnector", (), {})
    cfg = types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_buffer_device="cuda"),
                                model_config=types.SimpleNamespace(is_hybrid=False))
    assert kv_cache_layout.layout_wrapper(lambda c: "LBHNC", cls, (cfg,), {}) == "LBHNC"
    stock = "3" * 64
    _state.remember_hashes(stock, cross_layer=False)

    def failing(*a, **k):
        raise RuntimeError("NIXL compatibility hash mismatch. Local: %s, Remote: %s. Prefill ..."
                           % (stock, layout.tag_hash(stock)))

    w = types.SimpleNamespace(compat_hash=stock, kv_transfer_config=types.SimpleNamespace(kv_role="kv_both"))
    with pytest.raises(XlkvMismatchError) as e:
        handshake.handshake_wrapper(failing, w, (), {})
    msg = str(e.value)
    assert "here: VLLM_KV_CACHE_LAYOUT=LBHNC is set explicitly and wins" in msg
    assert "remote engine runs xlkv's cross-layer KV layout" in msg
    assert "set ENABLE_XLKV=true on BOTH" not in msg


def test_hash_mismatch_against_an_xlkv_peer_is_explained_on_the_stock_side(release):
    # this side kept the stock layout (fallback or flag unset here); it never tagged a hash
    stock = "2" * 64

    def failing(*a, **k):
        raise RuntimeError("NIXL compatibility hash mismatch. Local: %s, Remote: %s. Prefill" % (stock, layout.tag_hash(stock)))

    w = types.SimpleNamespace(compat_hash=stock, kv_transfer_config=types.SimpleNamespace(kv_role="kv_both"))
    with pytest.raises(XlkvMismatchError) as e:
        handshake.handshake_wrapper(failing, w, (), {})
    msg = str(e.value)
    # the wrappers run only with ENABLE_XLKV on: never "unset here" or "set ENABLE_XLKV=true on it"
    assert "kv_both engine runs the stock per-layer KV layout (ENABLE_XLKV is set here, but xlkv kept" in msg
    assert "remote engine runs xlkv's cross-layer KV layout" in msg
    assert "set ENABLE_XLKV=true on it" not in msg and "unset here" not in msg
    assert "unset ENABLE_XLKV on the remote engine" in msg


def test_unknown_hash_mismatch_keeps_vllms_error(release):
    def failing(*a, **k):
        raise RuntimeError("NIXL compatibility hash mismatch. Local: aa, Remote: %s." % ("f" * 64))

    with pytest.raises(RuntimeError, match="hash mismatch") as e:
        handshake.handshake_wrapper(failing, types.SimpleNamespace(compat_hash="aa"), (), {})
    assert not isinstance(e.value, XlkvMismatchError)


def test_hash_wrapper_tags_only_cross_layer(release):
    calls = []

    def fake_hash(vllm_config, attn_backend_name, cross_layers_blocks):
        calls.append(cross_layers_blocks)
        return ("x" if cross_layers_blocks else "s") * 64

    assert compat_hash.flag_hash_wrapper(fake_hash, None, (None, "FLASH_ATTN", False), {}) == "s" * 64
    tagged = compat_hash.flag_hash_wrapper(fake_hash, None, (None, "FLASH_ATTN", True), {})
    assert tagged == layout.tag_hash("x" * 64)
    assert _state.KNOWN["x" * 64] == _state.NATIVE
    assert _state.KNOWN["s" * 64] == _state.PER_LAYER


def test_hash_wrapper_0_29_uses_resolved_layout(release):
    release("0.29.0")

    def cfg(name):
        layout_obj = types.SimpleNamespace(name=name)
        return types.SimpleNamespace(cache_config=types.SimpleNamespace(get_resolved_kv_cache_layout=lambda: layout_obj))

    fake = lambda vllm_config, attn_backend_name, transfer_mode="pull": "h" * 64  # noqa: E731
    assert compat_hash.layout_hash_wrapper(fake, None, (cfg("LBHNC"), "FLASH_ATTN"), {}) == "h" * 64
    assert compat_hash.layout_hash_wrapper(fake, None, (cfg("BLNHC"), "FLASH_ATTN"), {}) == layout.tag_hash("h" * 64)


def test_hash_wrapper_0_29_tags_the_heads_outermost_rows(release):
    release("0.33.0")

    def cfg(name):
        layout_obj = types.SimpleNamespace(name=name)
        return types.SimpleNamespace(cache_config=types.SimpleNamespace(get_resolved_kv_cache_layout=lambda: layout_obj))

    fake = lambda vllm_config, attn_backend_name, transfer_mode="pull": "r" * 64  # noqa: E731
    heads = compat_hash.layout_hash_wrapper(fake, None, (cfg("BHLNC"), "FLASH_ATTN"), {})
    # one tag for BHLNC rows at any KV heads per rank (both sides of a TP 1 -> 2 pair publish it), another
    # for token-major rows (MLA), and an older xlkv's one-KV-head rows recognised
    assert heads == layout.tag_hash("r" * 64, layout.HEADS_OUTERMOST_ROWS) != layout.tag_hash("r" * 64)
    assert compat_hash.layout_hash_wrapper(fake, None, (cfg("BLNHC"), "FLASH_ATTN"), {}) == layout.tag_hash("r" * 64)
    assert _state.KNOWN[heads] == _state.XLKV_HEADS and _state.KNOWN[layout.tag_hash("r" * 64)] == _state.XLKV
    assert _state.KNOWN[layout.tag_hash("r" * 64, layout.ROW_AT_ONE_KV_HEAD)] == _state.XLKV_ROW


@pytest.mark.parametrize("local_tp, remote_tp", [(2, 2), (2, 1)])
def test_an_older_xlkv_peer_is_refused_with_the_cause(release, local_tp, remote_tp):
    """An xlkv before 0.7.0 (BLNHC rows, one KV head per rank tagged apart): refused at any TP pairing,
    naming both layouts and the fix (the same xlkv_autopatch on both sides)."""
    release("0.33.0")
    stock = "7" * 64
    ours = _state.remember_hashes(stock, cross_layer=True, heads_outermost=True)
    older = layout.tag_hash(stock, layout.ROW_AT_ONE_KV_HEAD)

    def failing(*a, **k):
        raise RuntimeError("NIXL compatibility hash mismatch. Local: %s, Remote: %s. Prefill" % (ours, older))

    w = types.SimpleNamespace(compat_hash=ours, world_size=local_tp,
                              kv_transfer_config=types.SimpleNamespace(kv_role="kv_consumer"))
    with pytest.raises(XlkvMismatchError) as e:
        handshake.handshake_wrapper(failing, w, ("127.0.0.1", 5600, remote_tp), {})
    msg = str(e.value)
    assert "this kv_consumer engine runs xlkv's heads-outermost KV layout" in msg, msg
    assert "the remote engine runs xlkv's token-major KV layout at one KV head per tensor-parallel rank" in msg, msg
    assert "an xlkv_autopatch before 0.7.0" in msg and "with the same xlkv_autopatch" in msg, msg


def test_a_stock_side_names_a_heads_outermost_peer(release):
    release("0.33.0")
    stock = "8" * 64

    def failing(*a, **k):
        raise RuntimeError("NIXL compatibility hash mismatch. Local: %s, Remote: %s."
                           % (stock, layout.tag_hash(stock, layout.HEADS_OUTERMOST_ROWS)))

    w = types.SimpleNamespace(compat_hash=stock, kv_transfer_config=types.SimpleNamespace(kv_role="kv_both"))
    with pytest.raises(XlkvMismatchError) as e:
        handshake.handshake_wrapper(failing, w, (), {})
    assert "remote engine runs xlkv's heads-outermost KV layout" in str(e.value)


def _fa(blocks):
    class T:
        def __init__(self, shape):
            self.shape = shape

        def __getitem__(self, i):
            return T(self.shape[1:])

    return T((2, blocks, 16, 2, 64))


def test_block_counts_reconciled_before_registration(release):
    seen = {}

    def original(kv_caches):
        seen["num_blocks"] = w.num_blocks
        return "registered"

    w = worker(num_blocks=64, _logical_num_blocks=64, _physical_blocks_per_logical_kv_block=1, num_regions=8)
    assert block_count.register_wrapper(original, w, ({"l0": _fa(96), "l1": _fa(96)},), {}) == "registered"
    assert seen["num_blocks"] == 96 and w._logical_num_blocks == 96

    # a per-layer registration (xlkv kept the stock layout, or decided nothing in this process):
    # the counts are vLLM's business, untouched, even where they disagree
    for reason in (None, "a fallback"):
        if reason:
            _state.note_stock_reason(reason)
        w = worker(num_blocks=64, _logical_num_blocks=64, _physical_blocks_per_logical_kv_block=1, num_regions=8,
                   _xlkv_cross_layer=False)
        assert block_count.register_wrapper(original, w, ({"l0": _fa(96), "l1": _fa(96)},), {}) == "registered"
        assert seen["num_blocks"] == 64 and w._logical_num_blocks == 64
        assert block_count.register_wrapper(original, w, ({"l0": _fa(64), "l1": _fa(65)},), {}) == "registered"
    _state._stock_reasons.clear()
    # 0.16-0.28: the one tensor the model runner registers after xlkv made the connector prefer
    # cross-layer blocks in this process is checked (and reconciled)
    _state.note_cross_layer_preferred()
    w = worker(num_blocks=64, _logical_num_blocks=64, _physical_blocks_per_logical_kv_block=1, _xlkv_cross_layer=False)
    assert block_count.register_wrapper(original, w, ({"all": _fa(96)},), {}) == "registered"
    assert seen["num_blocks"] == 96

    w = worker(num_blocks=64)
    with pytest.raises(XlkvRegistrationError, match="disagree"):
        block_count.register_wrapper(original, w, ({"l0": _fa(64), "l1": _fa(65)},), {})
    with pytest.raises(XlkvRegistrationError, match="hold 32 blocks"):
        block_count.register_wrapper(original, w, ({"l0": _fa(32)},), {})
    release("0.33.0")
    with pytest.raises(XlkvRegistrationError, match="over-allocated"):
        block_count.register_wrapper(original, worker(num_blocks=64), ({"l0": _fa(96)},), {})
    # 0.29+: vLLM's own registration assertions under xlkv's layout name the layout and the fix
    def asserting(kv_caches):
        raise AssertionError  # what a bare `assert` raises (pytest would rewrite one written here)

    blnhc = worker(num_blocks=64, _xlkv_cross_layer=False, kv_cache_layout="BLNHC")
    with pytest.raises(XlkvRegistrationError, match="block-outermost layout .*failed: raise AssertionError"):
        block_count.register_wrapper(asserting, blnhc, ({"l0": _fa(64)},), {})
    with pytest.raises(AssertionError):  # the stock layout: vLLM's error as it is
        block_count.register_wrapper(asserting, worker(num_blocks=64, _xlkv_cross_layer=False, kv_cache_layout="LBHNC"),
                                     ({"l0": _fa(64)},), {})
    # 0.29+ views in logical blocks of 2 kernel blocks each: the worker counts 128 kernel blocks
    w = worker(num_blocks=128, _physical_blocks_per_logical_kv_block=2)
    assert block_count.register_wrapper(original, w, ({"l0": _fa(64), "l1": _fa(64)},), {}) == "registered"
    assert seen["num_blocks"] == 128
    with pytest.raises(XlkvRegistrationError, match="disagree"):
        block_count.register_wrapper(original, w, ({"l0": _fa(64), "l1": _fa(63)},), {})
    # a release that indexes every region by its own count (0.33: region_num_blocks) gets the
    # regions as they are, under xlkv's layout too
    w = worker(num_blocks=128, _physical_blocks_per_logical_kv_block=2, region_num_blocks=[])
    assert block_count.register_wrapper(original, w, ({"l0": _fa(64), "l1": _fa(63)},), {}) == "registered"
    # 0.29+ stock layout (MLA, HiSparse host pools...): no count check of xlkv's at all
    w = worker(num_blocks=9, _xlkv_cross_layer=False, kv_cache_layout="LBHNC")
    assert block_count.register_wrapper(original, w, ({"mla.device": _fa(9), "mla.host": _fa(4)},), {}) == "registered"


def test_regions_that_disagree_refused_where_vllm_checks_no_count(release):
    """0.12-0.17 take the registered count from the first region and check no other (no budget,
    so no reconciliation behind this check): the refusal is the only guard there (on real
    vLLM: tests/real/test_pd_transfer.py, --plant-fault uneven-regions)."""
    release("0.14.1")
    assert not facts.current().budget_block_count
    seen = []
    w = worker(num_blocks=40)
    with pytest.raises(XlkvRegistrationError, match=r"tensors disagree on their block count \(l0\[0\]=40, l0\[1\]=39\)"):
        block_count.register_wrapper(lambda kv_caches: seen.append(kv_caches), w, ({"l0": [_fa(40)[0], _fa(39)[0]]},), {})
    assert seen == []  # vLLM's registration never ran


def test_model_runner_forces_v1_only_when_it_should(monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    nixl = types.SimpleNamespace(kv_connector="NixlConnector", kv_connector_extra_config={})
    cfg = types.SimpleNamespace(kv_transfer_config=nixl, model_config=types.SimpleNamespace(use_mla=False),
                                speculative_config=None, parallel_config=types.SimpleNamespace())
    v2 = lambda: True  # noqa: E731
    assert model_runner.runner_wrapper(v2, cfg, (), {}) is False
    assert model_runner.runner_wrapper(lambda: False, cfg, (), {}) is False
    other = types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_connector="LMCacheConnectorV1"),
                                  model_config=cfg.model_config, speculative_config=None)
    assert model_runner.runner_wrapper(v2, other, (), {}) is True
    multi = types.SimpleNamespace(kv_connector="MultiConnector",
                                  kv_connector_extra_config={"connectors": [{"kv_connector": "NixlConnector"}]})
    assert model_runner.runner_wrapper(v2, types.SimpleNamespace(kv_transfer_config=multi, model_config=cfg.model_config,
                                                                 speculative_config=None), (), {}) is False
    mla = types.SimpleNamespace(kv_transfer_config=nixl, model_config=types.SimpleNamespace(use_mla=True))
    assert model_runner.runner_wrapper(v2, mla, (), {}) is True
    spec = types.SimpleNamespace(kv_transfer_config=nixl, model_config=cfg.model_config, speculative_config=object())
    assert model_runner.runner_wrapper(v2, spec, (), {}) is True
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    assert model_runner.runner_wrapper(v2, cfg, (), {}) is True
    monkeypatch.setenv("XLKV_STRICT", "1")
    with pytest.raises(XlkvError, match="XLKV_STRICT=1"):
        model_runner.runner_wrapper(v2, cfg, (), {})


def _model_cfg(**kw):
    """A VllmConfig stand-in whose model answers what families.decide reads."""
    hf = types.SimpleNamespace(**kw.pop("hf", {}))
    heads = kw.pop("heads", 2)
    fields = dict(is_hybrid=False, use_mla=False, hf_text_config=hf, get_num_kv_heads=lambda parallel: heads)
    fields.update(kw)
    model = types.SimpleNamespace(**fields)
    return types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(kv_buffer_device="cuda"),
                                 model_config=model, parallel_config=types.SimpleNamespace(pipeline_parallel_size=1))


def test_layout_wrapper(monkeypatch, release):
    release("0.33.0")
    monkeypatch.delenv("VLLM_KV_CACHE_LAYOUT", raising=False)
    cls = type("NixlPullConnector", (), {})
    cfg = _model_cfg()
    assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (cfg,), {}) == "BHLNC"
    # MLA: NixlConnector asks for nothing, xlkv for the token-major block-outermost layout (packed latent rows)
    assert kv_cache_layout.layout_wrapper(lambda cfg: None, cls, (_model_cfg(use_mla=True, heads=1),), {}) == "BLNHC"
    # sliding-window + full attention: BHLNC (one shared whole-row region for every group, heads outermost)
    swa = _model_cfg(hf=dict(sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2))
    assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (swa,), {}) == "BHLNC"
    # one KV head per rank: BHLNC (page_contiguous.py registers each row as one region)
    assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (_model_cfg(heads=1),), {}) == "BHLNC"
    # stock, each with its WARNING: sparse-indexer MLA, Mamba hybrids, one KV head per rank with pipeline stages
    sparse = _model_cfg(use_mla=True, heads=1, hf=dict(index_topk=2048))
    assert kv_cache_layout.layout_wrapper(lambda cfg: None, cls, (sparse,), {}) is None
    assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (_model_cfg(is_hybrid=True),), {}) == "LBHNC"
    pp2 = _model_cfg(heads=1)
    pp2.parallel_config.pipeline_parallel_size = 2
    assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (pp2,), {}) == "LBHNC"
    no_model = types.SimpleNamespace(kv_transfer_config=cfg.kv_transfer_config, model_config=None)
    assert kv_cache_layout.layout_wrapper(lambda cfg: None, cls, (no_model,), {}) is None
    monkeypatch.setenv("XLKV_STRICT", "1")
    with pytest.raises(XlkvError, match="sparse indexer"):
        kv_cache_layout.layout_wrapper(lambda cfg: None, cls, (sparse,), {})
    monkeypatch.delenv("XLKV_STRICT")
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "LBNHC")
    assert kv_cache_layout.layout_wrapper(lambda cfg: "LBHNC", cls, (cfg,), {}) == "LBHNC"


#: the attention backend vLLM's property module would report (native_wrapper reads it there: the module
#: of the property function, here this test module)
_BACKEND = {"name": "FLASH_ATTN"}


def get_current_attn_backend(vllm_config):
    return types.SimpleNamespace(get_name=lambda: _BACKEND["name"])


def test_native_preference_sees_the_opt_in_without_editing_the_config(release, monkeypatch, caplog):
    extra = {}
    conn = types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config=extra, kv_role="kv_both"),
        _vllm_config=types.SimpleNamespace(model_config=types.SimpleNamespace(use_mla=False)),
        connector_worker=None)

    def upstream_property(self):  # what vLLM's guard ends with
        return str(self.kv_transfer_config.kv_connector_extra_config.get(
            "enable_cross_layers_blocks", "False")).lower() == "true"

    assert upstream_property(conn) is False
    assert cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {}) is True
    assert extra == {}  # the user's config is untouched
    extra["enable_cross_layers_blocks"] = "false"  # explicit opt-out wins
    assert cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {}) is False
    extra.clear()
    conn._vllm_config.model_config.use_mla = True
    assert cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {}) is False
    conn._vllm_config.model_config.use_mla = False
    # cross-layer blocks that cannot be sliced by KV heads (a blocks-first backend, FLASH_ATTN
    # on 0.23-0.25) would refuse a peer at another TP size, which stock serves: the stock layout, one INFO line
    for rel, name in (("0.21.0", "FLASHINFER"), ("0.21.0", "TRITON_ATTN"), ("0.24.0", "FLASH_ATTN")):
        release(rel)
        monkeypatch.setattr(_state, "_stock_reasons", [])
        monkeypatch.setitem(_BACKEND, "name", name)
        caplog.clear()
        monkeypatch.setattr(logs, "_seen", set())
        with caplog.at_level("INFO", logger="vllm.xlkv_autopatch"):
            assert cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {}) is False
        (reason,) = _state.stock_reasons()
        assert name in reason and "XLKV_EQUAL_TP=true" in reason and "blocks-first" in reason
        assert [r.levelname for r in caplog.records if "XLKV_EQUAL_TP" in r.getMessage()] == ["INFO"]
        monkeypatch.setenv("XLKV_EQUAL_TP", "true")  # every peer at this TP size: the cross-layer blocks
        assert cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {}) is True
        monkeypatch.delenv("XLKV_EQUAL_TP")
        extra["enable_cross_layers_blocks"] = "true"  # the user's own opt-in: vLLM's answer stands
        assert cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {}) is True
        extra.clear()
    monkeypatch.setenv("XLKV_STRICT", "1")  # strict: a kept stock layout is an error, this one too
    with pytest.raises(XlkvError, match="XLKV_EQUAL_TP=true"):
        cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {})
    monkeypatch.delenv("XLKV_STRICT")
    release("0.26.0")  # FLASH_ATTN keeps heads outermost here: no change
    monkeypatch.setitem(_BACKEND, "name", "FLASH_ATTN")
    assert cross_layer_preference.native_wrapper(upstream_property, conn, (conn,), {}) is True


def test_kvcached_refused_only_with_the_flag_on(monkeypatch):
    monkeypatch.delenv("ENABLE_KVCACHED", raising=False)
    monkeypatch.delenv("KVCACHED_AUTOPATCH", raising=False)
    monkeypatch.setenv("ENABLE_XLKV", "true")
    refuse_kvcached()
    monkeypatch.setenv("ENABLE_KVCACHED", "true")
    with pytest.raises(XlkvError, match="ENABLE_KVCACHED and ENABLE_XLKV are both set"):
        refuse_kvcached()
    monkeypatch.delenv("ENABLE_XLKV")
    refuse_kvcached()  # kvcached alone: not xlkv's business


class _Conn:
    def __init__(self, prefer):
        self.prefer_cross_layer_blocks = prefer
        self.registered = []

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        self.registered.append((kv_cache, attn_backend))


class NixlConnector(_Conn):
    pass


class ExampleConnector(_Conn):
    pass


def test_multi_connector_backport_is_the_and_of_its_children(monkeypatch, caplog):
    multi = types.SimpleNamespace(_connectors=[NixlConnector(True)])
    assert multi_connector.backport_attribute(False, multi, object) is True
    assert multi_connector.backport_attribute(False, None, object) is False  # class access: untouched
    assert multi_connector.backport_attribute(False, types.SimpleNamespace(_connectors=[]), object) is False
    mixed = types.SimpleNamespace(_connectors=[NixlConnector(True), ExampleConnector(False)])
    with caplog.at_level("WARNING", logger="vllm.xlkv_autopatch"):
        assert multi_connector.backport_attribute(False, mixed, object) is False
    assert "also runs ExampleConnector" in caplog.text
    monkeypatch.setenv("XLKV_STRICT", "1")
    with pytest.raises(XlkvError, match="ExampleConnector"):
        multi_connector.backport_attribute(False, mixed, object)


def test_multi_connector_warns_only_when_nixl_wanted_cross_layer(monkeypatch):
    monkeypatch.setenv("XLKV_STRICT", "1")  # any fallback would raise
    nixl_off = types.SimpleNamespace(_connectors=[NixlConnector(False), ExampleConnector(False)])
    assert multi_connector.property_wrapper(lambda: False, nixl_off, (), {}) is False
    both = types.SimpleNamespace(_connectors=[NixlConnector(True)])
    assert multi_connector.property_wrapper(lambda: True, both, (), {}) is True
    mixed = types.SimpleNamespace(_connectors=[NixlConnector(True), ExampleConnector(False)])
    with pytest.raises(XlkvError, match="stock per-layer KV layout is kept"):
        multi_connector.property_wrapper(lambda: False, mixed, (), {})


def test_multi_connector_register_reaches_every_child():
    children = [NixlConnector(True), NixlConnector(True)]
    calls = []
    multi_connector.register_wrapper(lambda *a, **k: calls.append(a), types.SimpleNamespace(_connectors=children),
                                     ("tensor", "backend"), {})
    assert calls == [("tensor", "backend")]  # the original (no-op) stays in the chain
    assert [c.registered for c in children] == [[("tensor", "backend")]] * 2


def test_over_allocation_is_seen_in_the_storage_under_budget_sized_views():
    """0.29+ reshape an over-allocated tensor to the budget's block count, so only
    the storage underneath holds the extra blocks; vLLM's check then fails as "cannot be
    partitioned", and the shim names the over-allocation instead.  (Real torch tensors, no vLLM.)"""
    torch = pytest.importorskip("torch")
    layers, page, budget = 4, 6, 40
    exact = torch.zeros(budget * layers * page)
    over = torch.zeros((budget + 10) * layers * page)

    def views(storage):  # BLNHC: each layer's view strides over whole rows of the shared storage
        rows = storage[:budget * layers * page].view(budget, layers, page)
        return {"layer.%d" % i: rows[:, i, :] for i in range(layers)}

    assert block_count.storage_over_allocation(views(exact)) is None
    assert block_count.storage_over_allocation(views(over)) == (50, 40)
    assert block_count.storage_over_allocation({"t": over.view(50, layers * page)}) is None  # a view of it all
    assert block_count.storage_over_allocation({"not a tensor": [1, 2]}) is None
    short = dict(views(exact), **{"layer.0": views(exact)["layer.0"][:-1]})  # one view short: not over-allocated
    assert block_count.storage_over_allocation(short) is None
    text = block_count.over_allocated_message(50, 40, facts.facts_for("0.33.0"))
    assert "over-allocated, they hold 50 blocks and the scheduler budget (kv_cache_config.num_blocks) is 40" in text
    assert "vLLM 0.33" in text and "Fix: allocate exactly kv_cache_config.num_blocks blocks" in text


def test_one_kv_head_rows_reach_vllm_as_the_same_bytes_with_a_non_contiguous_page(release):
    """page_contiguous.py on vLLM-shaped views (BHLNC, as create_kv_cache_views builds them: a layer's
    view [blocks, heads, tokens, content] with the heads L x N x C apart); the stand-in register_kv_caches
    decides as vLLM 0.33's loop does (a contiguous page: a region per layer, else the whole row);
    tests/real runs vLLM's."""
    torch = pytest.importorskip("torch")
    from xlkv_autopatch.patches import page_contiguous
    release("0.33.0")
    layers, blocks, tokens, content = 4, 40, 16, 128
    page = tokens * content  # one head's page of one layer, in elements

    def bhlnc(heads=1, pad=0):
        row = layers * page * heads + pad
        buf = torch.arange(blocks * row, dtype=torch.float32)  # every element distinct
        return {"model.layers.%d.self_attn.attn" % i: buf.as_strided(
            (blocks, heads, tokens, content), (row, layers * page, content, 1), i * page)
            for i in range(layers)}

    kv = bhlnc()
    out, row_bytes = page_contiguous.row_views(kv)
    assert row_bytes == layers * page * 4 and list(out) == list(kv)
    for name, v in kv.items():
        w = out[name]
        assert v[0].is_contiguous() and not w[0].is_contiguous()
        assert (w.shape, w.data_ptr(), w.nbytes, w.stride(0)) == (v.shape, v.data_ptr(), v.nbytes, v.stride(0))
        for b in (0, 7, blocks - 1):  # the same bytes, walked in another order
            assert torch.equal(w[b].flatten().sort().values, v[b].flatten().sort().values)
            assert not torch.equal(w[b].flatten(), v[b].flatten())
    # views that are not pages of one row each are left to vLLM, with the reason
    assert page_contiguous.row_views({n: v for n, v in list(kv.items())[:3]})[1].startswith("the layers' pages")
    assert page_contiguous.row_views({"x": torch.zeros(40, 2, 16, 128)})[0] is None
    # the heads tile the row at one and at two KV heads per rank; a padded row or a missing layer does not
    assert page_contiguous.heads_tiling(kv) is None and page_contiguous.heads_tiling(bhlnc(2)) is None
    assert "padded" in page_contiguous.heads_tiling(bhlnc(2, pad=16))
    assert "byte offsets" in page_contiguous.heads_tiling({n: v for n, v in list(bhlnc(2).items())[:3]})

    seen = {}

    def vllm_like(kv_caches):  # the stand-in's region rule, and what vLLM keeps
        seen["given"] = kv_caches
        w.device_kv_caches = kv_caches
        bases = {v.data_ptr() if v[0].is_contiguous() else v.untyped_storage().data_ptr() for v in kv_caches.values()}
        w.num_regions = len(bases)
        stride = next(iter(kv_caches.values())).stride(0) * 4
        w.block_len_per_layer = [stride] if len(bases) == 1 else [page * 4] * len(bases)
        w.block_stride_per_layer = [stride] * len(bases)
        return "registered"

    w = types.SimpleNamespace(kv_cache_layout="BHLNC", use_mla=False, _has_mamba=False, use_host_buffer=False,
                              vllm_config=_model_cfg(heads=1))
    conn = types.SimpleNamespace(connector_worker=w)
    assert page_contiguous.register_wrapper(vllm_like, conn, (kv,), {}) == "registered"
    assert seen["given"] is not kv and w.num_regions == 1
    assert w.device_kv_caches is kv  # vLLM's own views for everything after registration
    assert _state.heads_outermost(w) == (True, None)  # handshake.py may let vLLM slice its heads
    # a sliding-window hybrid at one KV head per rank gets the same (the family no longer decides)
    swa = types.SimpleNamespace(**dict(vars(w), vllm_config=_model_cfg(heads=1, hf=SWA_HF)))
    swa.__dict__.pop(_state.HEADS_MARK, None)
    assert page_contiguous.register_wrapper(vllm_like, types.SimpleNamespace(connector_worker=swa), (kv,), {})
    assert seen["given"] is not kv and _state.heads_outermost(swa) == (True, None)
    # two KV heads per rank: vLLM's own whole-row branch, checked and marked; padded rows marked with the cause
    for views, verdict in ((bhlnc(2), (True, None)), (bhlnc(2, pad=16), (False, "padded"))):
        w2 = types.SimpleNamespace(**dict(vars(w), vllm_config=_model_cfg(heads=2)))
        w2.__dict__.pop(_state.HEADS_MARK, None)
        page_contiguous.register_wrapper(lambda kv_caches: vllm_like(kv_caches), types.SimpleNamespace(
            connector_worker=w2), (views,), {})
        assert seen["given"] is views
        sliceable, why = _state.heads_outermost(w2)
        assert sliceable is verdict[0] and (why is None if verdict[1] is None else verdict[1] in why), why
    # pipeline parallel > 1 at one KV head per rank: the family keeps the stock layout, so
    # the views reach vLLM untouched even under a whole-row layout name (a plant dropping decision.cross_layer
    # from the check hands them over)
    pp2 = _model_cfg(heads=1)
    pp2.parallel_config.pipeline_parallel_size = 2
    w_pp = types.SimpleNamespace(**dict(vars(w), vllm_config=pp2))
    w_pp.__dict__.pop(_state.HEADS_MARK, None)
    page_contiguous.register_wrapper(lambda kv_caches: seen.update(given=kv_caches),
                                     types.SimpleNamespace(connector_worker=w_pp), (kv,), {})
    assert seen["given"] is kv and _state.heads_outermost(w_pp) == (False, None)
    # not a whole-row layout, or host buffer: vLLM's registration untouched, nothing marked
    for kw in (dict(kv_cache_layout="LBHNC"), dict(use_host_buffer=True)):
        w3 = types.SimpleNamespace(**dict(vars(w), **kw))
        w3.__dict__.pop(_state.HEADS_MARK, None)
        page_contiguous.register_wrapper(lambda kv_caches: seen.update(given=kv_caches),
                                         types.SimpleNamespace(connector_worker=w3), (kv,), {})
        assert seen["given"] is kv and _state.heads_outermost(w3) == (False, None), kw
    # vLLM registering per layer anyway: refused, since the hash says one region per row
    with pytest.raises(XlkvRegistrationError, match="not one region of one row per block"):
        page_contiguous.register_wrapper(lambda kv_caches: vllm_like(kv), conn, (kv,), {})


# --------------------------------------------------------------- 0.24-0.28: packed KV cache groups

SWA_HF = dict(sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2)


def _planner_cfg(connector="NixlConnector", extra=None, buffer="cuda", device="cuda", **model):
    cfg = _model_cfg(**model)
    cfg.kv_transfer_config = types.SimpleNamespace(kv_connector=connector, kv_connector_extra_config=extra or {},
                                                   kv_buffer_device=buffer)
    cfg.device_config = types.SimpleNamespace(device_type=device)
    return cfg


def test_packed_predicate_packs_sliding_window_hybrids_only(release, monkeypatch):
    from xlkv_autopatch.patches import packed_kv_cache_config as P

    release("0.26.0")
    no = lambda vllm_config, kv_cache_groups: False  # noqa: E731  vLLM's answer without the opt-in
    two = ["full", "sliding"]
    swa = _planner_cfg(hf=SWA_HF)
    # packed rows cannot be sliced by KV heads: packed only where every peer runs this TP size
    assert P.predicate_wrapper(no, None, (swa, two), {}) is False
    monkeypatch.setenv("XLKV_EQUAL_TP", "1")
    assert P.predicate_wrapper(no, None, (swa, two), {}) is True
    assert _state.stock_reasons() == []
    # vLLM's own yes stands (DeepSeek-V4 specs, the user's opt-in)
    assert P.predicate_wrapper(lambda *a: True, None, (_planner_cfg(), two), {}) is True
    # not ours to change: one group, a dense model, MLA, a Mamba hybrid, another connector
    assert P.predicate_wrapper(no, None, (swa, ["full"]), {}) is False
    for cfg in (_planner_cfg(), _planner_cfg(use_mla=True, heads=1), _planner_cfg(is_hybrid=True, hf=SWA_HF),
                _planner_cfg(connector="LMCacheConnectorV1", hf=SWA_HF)):
        assert P.predicate_wrapper(no, None, (cfg, two), {}) is False
    assert _state.stock_reasons() == []
    # a MultiConnector of NIXL connectors only: the same decision as a plain NixlConnector
    nixl_only = dict(connectors=[{"kv_connector": "NixlConnector"}])
    assert P.predicate_wrapper(no, None, (_planner_cfg(connector="MultiConnector", extra=nixl_only, hf=SWA_HF), two),
                               {}) is True
    # a hybrid kept stock with the cause: an explicit opt-out, a MultiConnector with another connector in it,
    # host-buffer mode
    multi = dict(connectors=[{"kv_connector": "NixlConnector"}, {"kv_connector": "LMCacheConnectorV1"}])
    for cfg, words in ((_planner_cfg(extra={"enable_cross_layers_blocks": "false"}, hf=SWA_HF), "=false"),
                       (_planner_cfg(connector="MultiConnector", extra=multi, hf=SWA_HF),
                        "a MultiConnector with LMCacheConnectorV1 beside its NixlConnector"),
                       (_planner_cfg(buffer="cpu", hf=SWA_HF), "host-buffer")):
        assert P.predicate_wrapper(no, None, (cfg, two), {}) is False
        assert words in _state.stock_reasons()[-1] and "sliding-window" in _state.stock_reasons()[-1]
    # the CPU platform has no host buffer (NIXL registers host memory directly)
    assert P.predicate_wrapper(no, None, (_planner_cfg(buffer="cpu", device="cpu", hf=SWA_HF), two), {}) is True
    monkeypatch.setenv("XLKV_STRICT", "1")
    with pytest.raises(XlkvError, match="MultiConnector"):
        P.predicate_wrapper(no, None, (_planner_cfg(connector="MultiConnector", extra=multi, hf=SWA_HF), two), {})


def test_packed_registration_tags_the_hash_and_refuses_heterogeneous_tp(release, monkeypatch):
    from xlkv_autopatch.patches import packed_kv_cache_config as P

    release("0.26.0")
    monkeypatch.setenv("XLKV_EQUAL_TP", "1")  # packed only then

    def fake_hash(vllm_config, attn_backend_name, cross_layers_blocks):
        return ("x" if cross_layers_blocks else "s") * 64

    def register(storage):  # vLLM's _register_packed_kv_cache computes the hash with cross_layers_blocks=False
        w.compat_hash = compat_hash.flag_hash_wrapper(fake_hash, None, (None, "FLASH_ATTN", False), {})

    groups = types.SimpleNamespace(kv_cache_groups=[1, 2])
    w = worker(_xlkv_cross_layer=False, vllm_config=_planner_cfg(hf=SWA_HF), kv_cache_config=groups)
    P.register_wrapper(register, w, (object(),), {})
    assert w.compat_hash == layout.tag_hash("x" * 64)
    assert _state.is_cross_layer(w) and _state.is_packed_groups(w)
    assert _state.describe_hash("s" * 64) == _state.UNTAGGED_PACKED and _state.is_untagged(_state.UNTAGGED_PACKED)
    assert not _state.packing_now()
    # heterogeneous TP refused with the cause (FLASH_ATTN's heads-outermost slicing does not apply)
    w.world_size = 2
    with pytest.raises(XlkvMismatchError, match="packed multi-group KV layout .* cannot be sliced by heads"):
        handshake.validate_wrapper(ok, w, (meta(), 0, 1), {})
    w.world_size = 1
    # a stock peer (or vLLM's own opt-in without xlkv) publishes the stock hash: refused, both named
    with pytest.raises(XlkvMismatchError) as e:
        handshake.handshake_wrapper(lambda *a: (_ for _ in ()).throw(RuntimeError(
            "NIXL compatibility hash mismatch. Local: %s, Remote: %s." % (w.compat_hash, "s" * 64))), w, (), {})
    assert "runs xlkv's cross-layer KV layout" in str(e.value) and "packed multi-group" in str(e.value)
    assert "set ENABLE_XLKV=true on BOTH" in str(e.value)
    # a dense model's packed registration (not xlkv's decision) is vLLM's own: untouched, stock hash
    dense = worker(_xlkv_cross_layer=False, vllm_config=_planner_cfg(), kv_cache_config=groups)
    w = dense
    P.register_wrapper(register, dense, (object(),), {})
    assert dense.compat_hash == "s" * 64 and not _state.is_cross_layer(dense)


def test_native_preference_of_a_sliding_window_hybrid_follows_its_kv_cache_groups(release, monkeypatch):
    """One cross-layer tensor only for one KV cache group; several groups: stock with the family
    named before 0.24; on 0.24-0.28 stock so that any TP pairing is served, or with XLKV_EQUAL_TP the
    planner's packing (the property keeps vLLM's own answer)."""
    def upstream_property(self):
        return str(self.kv_transfer_config.kv_connector_extra_config.get(
            "enable_cross_layers_blocks", "False")).lower() == "true"

    def conn(groups):
        return types.SimpleNamespace(
            kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config={}, kv_role="kv_both"),
            _vllm_config=_model_cfg(hf=SWA_HF), connector_worker=None,
            kv_cache_config=types.SimpleNamespace(kv_cache_groups=[object()] * groups))

    for rel in ("0.21.0", "0.26.0"):
        release(rel)
        c = conn(1)  # vLLM's hybrid KV cache manager off: one group, the dense path
        assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is True
    assert _state.stock_reasons() == []
    c = conn(2)
    assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False
    (reason,) = _state.stock_reasons()
    assert "XLKV_EQUAL_TP=true" in reason and "packed multi-group rows" in reason
    monkeypatch.setattr(_state, "_stock_reasons", [])
    monkeypatch.setenv("XLKV_EQUAL_TP", "1")
    assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False
    assert _state.stock_reasons() == []  # packed by the planner: nothing kept stock, no WARNING
    monkeypatch.delenv("XLKV_EQUAL_TP")
    release("0.21.0")
    assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False
    (reason,) = _state.stock_reasons()
    assert reason.startswith("sliding-window + full attention hybrid") and "several KV cache groups" in reason


def test_native_preference_of_mla_follows_the_release_and_its_backend(release, monkeypatch):
    """0.26-0.28: vLLM's own guard accepts no MLA backend; under the flag an MLA
    model gets cross-layer blocks on the MLA backends of the release row (releases.MLA_BACKENDS)
    that index their latent cache by the block stride; any other MLA backend keeps the stock layout
    with a WARNING naming it; 0.21 (no MLA backends in its row) keeps stock with the family named."""
    import sys

    mod = types.ModuleType("xlkv_test_fake_nixl_connector")
    backend = {"name": "TRITON_MLA", "strided": True}

    class Backend:
        @staticmethod
        def get_name():
            return backend["name"]

        @classmethod
        def indexes_kv_by_block_stride(cls):
            return backend["strided"]

    mod.get_current_attn_backend = lambda cfg: Backend
    monkeypatch.setitem(sys.modules, mod.__name__, mod)

    def upstream_property(self):  # vLLM 0.26's guard: FLASH_ATTN, FLASHINFER, TRITON_ATTN only
        return False
    upstream_property.__module__ = mod.__name__

    def conn(spec=object()):
        return types.SimpleNamespace(
            kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config={}, kv_role="kv_both"),
            _vllm_config=_model_cfg(use_mla=True, heads=1), connector_worker=None,
            kv_cache_config=types.SimpleNamespace(kv_cache_groups=[types.SimpleNamespace(kv_cache_spec=spec)]))

    release("0.26.0")
    for name in ("TRITON_MLA", "FLASH_ATTN_MLA", "FLASHMLA"):
        backend["name"] = name
        c = conn()
        assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is True, name
    assert _state.stock_reasons() == []
    for n, name in enumerate(("CUTLASS_MLA", "FLASHINFER_MLA"), 1):  # block-major too, not run on a GPU: stock, named
        backend["name"] = name
        c = conn()
        assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False
        reason = _state.stock_reasons()[-1]
        assert len(_state.stock_reasons()) == n and name in reason and "run on a GPU with FLASH_ATTN_MLA, TRITON_MLA, FLASHMLA only" in reason
    backend.update(name="TRITON_MLA", strided=False)  # a backend that does not read by the block stride
    c = conn()
    assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False
    assert "does not index its latent cache by the block stride" in _state.stock_reasons()[-1]
    backend["strided"] = True
    c = conn(spec=type("MambaSpec", (), {})())  # a Mamba group beside MLA
    assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False
    c.kv_transfer_config.kv_connector_extra_config["enable_cross_layers_blocks"] = "false"
    assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False  # explicit opt-out wins
    release("0.21.0")
    c = conn()
    assert cross_layer_preference.native_wrapper(upstream_property, c, (c,), {}) is False
    assert _state.stock_reasons()[-1].startswith("MLA (DeepSeek-V2/V3, Kimi K2 style): keeps the stock layout")


def test_backport_preference_keeps_the_stock_layout_for_a_blocks_first_backend(release, monkeypatch):
    """0.12-0.15: FLASHINFER's cross-layer blocks cannot be sliced by KV heads, so the
    backported preference answers False (the stock layout, any TP pairing served) unless XLKV_EQUAL_TP=true;
    FLASH_ATTN keeps its heads-outermost blocks."""
    import sys

    release("0.14.1")
    mod = types.ModuleType("xlkv_test_fake_backport_connector")
    mod.get_kv_cache_layout = lambda: "HND"
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    Connector = type("NixlConnector", (), {"__module__": mod.__name__})
    cfg = _model_cfg()
    cfg.kv_transfer_config.kv_connector_extra_config = {}
    conn = Connector()
    conn._vllm_config, conn._kv_cache_config = cfg, None
    conn.connector_worker = types.SimpleNamespace(backend_name="FLASH_ATTN", use_host_buffer=False)
    assert cross_layer_preference.backport_property_wrapper(lambda: False, conn, (), {}) is True
    conn.connector_worker.backend_name = "FLASHINFER"
    assert cross_layer_preference.backport_property_wrapper(lambda: False, conn, (), {}) is False
    (reason,) = _state.stock_reasons()
    assert "FLASHINFER" in reason and "XLKV_EQUAL_TP=true" in reason
    monkeypatch.setenv("XLKV_EQUAL_TP", "1")
    assert cross_layer_preference.backport_property_wrapper(lambda: False, conn, (), {}) is True
