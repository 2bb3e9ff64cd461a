"""Different block sizes on prefill and decode: the one decision (layout.block_sizes_served, which the
handshake and ``status --prefill-block-size`` ask) and the receive restage's wrapper
(patches/block_size_restage.py) on small torch tensors laid out as vLLM 0.33's BHLNC views.

The transfer is emulated as vLLM's block-size ratio path does it: each prefill block's row (a decode
rank's head range of it) read whole into one of the R equal byte parts of the decode block's row.
Every value names what it holds (prefill block, head, layer, token, content), so after the wrapper
each decode token must read exactly its prefill token; the tail past what prefill sent must be zero
and rows the transfer did not write must be untouched."""

import types

import pytest

from xlkv_autopatch import facts, layout
from xlkv_autopatch.patches import _state, block_size_restage as restage_mod
from xlkv_autopatch.registry import XlkvFunctionWrapper

torch = pytest.importorskip("torch")

HEADS, LAYERS, CONTENT, BLOCKS = 2, 3, 4, 12


@pytest.mark.parametrize("release,local_bs,remote_bs,local_tp,remote_tp,kw,served,descs,why", [
    ("0.33.0", 32, 32, 1, 1, {}, True, 1, "the same block size"),
    ("0.33.0", 32, 16, 1, 1, {}, True, 2, "2 descriptors per block per remote rank"),
    ("0.33.0", 64, 16, 2, 1, {}, True, 4, "4 descriptors per block per remote rank"),
    ("0.29.0", 32, 16, 1, 1, {}, True, 2, "read whole into one of 2 parts"),
    ("0.33.0", 16, 32, 1, 1, {}, False, None,
     "refuses 16-token blocks here facing 32-token blocks there with or without xlkv (AssertionError: Local block "
     "size 16 is not divisible by remote block size 32)"),
    ("0.33.0", 48, 32, 1, 1, {}, False, None, "refuses 48-token blocks here facing 32-token blocks"),
    ("0.26.0", 32, 16, 1, 1, {}, False, None, "cannot be re-split into the peer's token ranges"),
    ("0.33.0", 32, 16, 1, 2, {}, False, None, "prefill TP 2 > decode TP 1: vLLM refuses"),
    ("0.33.0", 32, 16, 1, 1, dict(mla=True), False, None, "MLA's BLNHC rows are not restaged"),
    ("0.33.0", 32, 16, 1, 1, dict(sliding_window=True), False, None, "a sliding-window KV cache group"),
    ("0.33.0", 32, 16, 1, 1, dict(heads_outermost_rows=False), False, None, "not xlkv's BHLNC rows"),
    ("0.33.0", 32, 16, 2, 1, dict(rows_why_not="the row is padded"), False, None,
     "whose KV heads tile them: the row is padded"),
    ("0.33.0", 32, 16, 1, 1, dict(restaged=False), False, None, "receive restage of BHLNC rows"),
])
def test_block_sizes_served(release, local_bs, remote_bs, local_tp, remote_tp, kw, served, descs, why):
    decision, n = layout.block_sizes_served(facts.facts_for(release), local_block_size=local_bs,
                                            remote_block_size=remote_bs, local_tp=local_tp, remote_tp=remote_tp, **kw)
    assert (decision.use, n) == (served, descs), decision
    assert why in decision.reason


def views(tokens, heads=HEADS, fill=-1.0):
    """vLLM 0.33's BHLNC views over one buffer: per layer [blocks, heads, tokens, content], the heads
    L x N x C apart, layer l's page at l x N x C in each head's run."""
    page = tokens * CONTENT
    row = LAYERS * page * heads
    buf = torch.full((BLOCKS * row,), fill, dtype=torch.float32)
    return buf, {"layer.%d" % i: buf.as_strided((BLOCKS, heads, tokens, CONTENT), (row, LAYERS * page, CONTENT, 1),
                                                i * page) for i in range(LAYERS)}


def value(block, head, layer, token, content):
    return float(1 + content + 10 * token + 1000 * layer + 10000 * head + 100000 * block)


def prefill_rows(tokens):
    """The prefill side's rows ([blocks, H, L, n, C], every value naming its coordinates)."""
    rows = torch.empty(BLOCKS, HEADS, LAYERS, tokens, CONTENT)
    for b in range(BLOCKS):
        for h in range(HEADS):
            for lay in range(LAYERS):
                for t in range(tokens):
                    for c in range(CONTENT):
                        rows[b, h, lay, t, c] = value(b, h, lay, t, c)
    return rows


def transfer(buf, p_rows, local_ids, remote_ids, ratio, heads, head_offset):
    """vLLM's ratio path: remote block k of the request into part k % R of local block k // R (its head
    range read whole: the heads are outermost)."""
    part = p_rows[0, head_offset:head_offset + heads].numel()
    row = part * ratio
    for k, rid in enumerate(remote_ids):
        lb = local_ids[k // ratio]
        start = lb * row + (k % ratio) * part
        buf[start:start + part] = p_rows[rid, head_offset:head_offset + heads].reshape(-1)


def worker(kv, tokens):
    w = types.SimpleNamespace(device_kv_caches=kv, block_size=tokens)
    geometry, why = restage_mod.row_geometry(kv, tokens)
    assert why is None
    setattr(w, restage_mod.GEOMETRY, geometry)
    _state.mark_restages(w)
    return w


@pytest.mark.parametrize("shape", ["0.29", "0.33"])
@pytest.mark.parametrize("ratio,heads,head_offset", [(2, HEADS, 0), (4, HEADS, 0), (2, 1, 1)])
def test_received_rows_are_restaged_token_by_token(shape, ratio, heads, head_offset):
    n = 4
    tokens = n * ratio
    p_rows = prefill_rows(n)
    buf, kv = views(tokens, heads)
    w = worker(kv, tokens)
    # request A: 3 whole decode blocks; request B: 1 whole + 1 prefill block of the next; one block past it
    requests = [([5, 2, 9], list(range(3 * ratio))), ([7, 1, 3], [11, 10, 8, 0, 6, 4, 7, 9, 1, 3, 5, 2][:ratio + 1])]
    for local_ids, remote_ids in requests:
        transfer(buf, p_rows, local_ids, remote_ids, ratio, heads, head_offset)
    before = buf.clone()
    calls = []

    def vllm(*args, **kwargs):
        calls.append((args, kwargs))

    items = [((0,) if shape == "0.33" else ()) + (ids, len(rids)) for ids, rids in requests]
    restage_mod.receive_wrapper(vllm, w, (ratio, items, True), {})
    # vLLM's own call: no conversion, covered counts rounded up to the rows the wrapper wrote
    ((args, kwargs),) = calls
    assert args[0] == ratio and args[2] is False and not kwargs
    assert args[1] == [((0,) if shape == "0.33" else ()) + (ids, c) for ids, c in
                       zip([r[0] for r in requests], [3 * ratio, 2 * ratio])]
    for local_ids, remote_ids in requests:
        for i, lb in enumerate(local_ids):
            for t in range(tokens):
                k = i * ratio + t // n
                for lay, name in enumerate(kv):
                    got = kv[name][lb, :, t, :]
                    if k < len(remote_ids) and i * ratio < len(remote_ids):
                        want = torch.tensor([[value(remote_ids[k], head_offset + h, lay, t % n, c)
                                              for c in range(CONTENT)] for h in range(heads)])
                        assert torch.equal(got, want), (lb, t, lay)
                    elif (i * ratio) < len(remote_ids):  # the written row's tail: zeroed
                        assert torch.all(got == 0), (lb, t, lay)
    # the row past request B's covered blocks (block 3) is exactly as the transfer left it
    row = buf.numel() // BLOCKS
    assert torch.equal(buf[3 * row:4 * row], before[3 * row:4 * row])


def test_other_workers_and_equal_blocks_are_vllms_call_untouched():
    buf, kv = views(8)
    calls = []

    def vllm(*args, **kwargs):
        calls.append((args, kwargs))

    unmarked = types.SimpleNamespace(device_kv_caches=kv, block_size=8)
    items = [(0, [1, 2], 3)]
    restage_mod.receive_wrapper(vllm, unmarked, (2, items, True), {})
    marked = worker(kv, 8)
    before = buf.clone()
    restage_mod.receive_wrapper(vllm, marked, (1, items, True), {})
    assert calls == [((2, items, True), {}), ((1, items, True), {})]
    assert torch.equal(buf, before)


def test_attach_marks_only_a_worker_whose_class_has_the_wrapper():
    _buf, kv = views(8)

    def original(self, block_size_ratio, block_ids_list, convert=True):
        return None

    class Wrapped:
        post_process_device_kv_on_receive = XlkvFunctionWrapper(original, restage_mod.receive_wrapper)

    class Stock:
        post_process_device_kv_on_receive = original

    for cls, marked in ((Wrapped, True), (Stock, False)):
        w = cls()
        w.block_size = 8
        restage_mod.attach(w, kv)
        assert _state.restages(w) is marked
    w = Wrapped()
    w.block_size = 16  # the views hold 8 tokens per block: no geometry, no mark
    restage_mod.attach(w, kv)
    assert not _state.restages(w)
