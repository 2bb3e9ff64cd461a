"""Different block sizes on prefill and decode (xlkv_autopatch.block_sizes): which byte ranges of the
remote cross-layer block rows make up one local block row.  No vLLM, no torch.

Every byte of a remote row is a tuple naming what it holds (remote block, head, layer, token, K/V,
content byte); the runs are applied by copying slices, and the local row must hold, at every
coordinate, what the test computes from the token arithmetic alone (not from any stride)."""

from itertools import product

import pytest

from xlkv_autopatch import block_sizes as B

HEADS, LAYERS, CONTENT = 4, 3, 2  # small, all different, so a wrong stride shows


def sizes_of(axes, heads, tokens):
    s = {"H": heads, "L": LAYERS, "N": tokens, "C": CONTENT}
    if "K" in axes:
        s["K"] = 2
    return s


def offset(axes, sizes, coords):
    """Byte offset of ``coords`` in a dense row (the test's own, written out per axis)."""
    off = 0
    for a in axes:
        off = off * sizes[a] + coords[a]
    return off


def remote_row(axes, block, tokens):
    s = sizes_of(axes, HEADS, tokens)
    row = [None] * B.row_bytes(axes, s)
    for idx in product(*(range(s[a]) for a in axes)):
        c = dict(zip(axes, idx))
        row[offset(axes, s, c)] = (block, c["H"], c["L"], c["N"], c.get("K", 0), c["C"])
    return row


def expected_local(axes, *, local_tokens, remote_tokens, blocks, part=0, local_heads=HEADS, head_offset=0):
    """The local row by the token arithmetic: local token t of a larger block is token
    t % remote_tokens of remote block t // remote_tokens; of a smaller one, token part * local_tokens + t."""
    s = sizes_of(axes, local_heads, local_tokens)
    row = [None] * B.row_bytes(axes, s)
    for idx in product(*(range(s[a]) for a in axes)):
        c = dict(zip(axes, idx))
        t = c["N"]
        if local_tokens >= remote_tokens:
            blk, rt = blocks[t // remote_tokens], t % remote_tokens
        else:
            blk, rt = blocks[0], part * local_tokens + t
        row[offset(axes, s, c)] = (blk, c["H"] + head_offset, c["L"], rt, c.get("K", 0), c["C"])
    return row


def apply(runs, remotes, length):
    """The local row after copying every run (None where no run wrote)."""
    local = [None] * length
    for r in runs:
        local[r.local_offset:r.local_offset + r.length] = remotes[r.remote][r.remote_offset:r.remote_offset + r.length]
    return local


def check(axes, runs, *, local_tokens, remote_tokens, part=0, local_heads=HEADS, head_offset=0, staged=False):
    """None when the runs (then, ``staged``, restage) give exactly the expected local row, else
    where they do not."""
    ratio, larger = B.pairing(local_tokens, remote_tokens)
    blocks = [10 + j for j in range(ratio if larger else 1)]
    remotes = [remote_row(axes, b, remote_tokens) for b in blocks]
    s = sizes_of(axes, local_heads, local_tokens)
    got = apply(runs, remotes, B.row_bytes(axes, s))
    if staged:
        got = B.restage(got, axes, sizes=s, ratio=ratio)
    want = expected_local(axes, local_tokens=local_tokens, remote_tokens=remote_tokens, blocks=blocks, part=part,
                          local_heads=local_heads, head_offset=head_offset)
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    return None if not wrong else "%d of %d bytes wrong, first at %d: %r != %r" % (
        len(wrong), len(want), wrong[0], got[wrong[0]], want[wrong[0]])


def shape(local_tokens, remote_tokens, **kw):
    return dict(layers=LAYERS, heads=HEADS, content_bytes=CONTENT, local_tokens=local_tokens,
                remote_tokens=remote_tokens, **kw)


AXES = ["HLNC", "LNHC", "LHNC", "NHLC", "NLHC", "HLKNC"]  # vLLM's three rows, token-outermost, FA 0.12-0.25


@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("local_tokens, remote_tokens", [(8, 4), (16, 4), (4, 4), (4, 8), (4, 16)])
def test_block_runs_give_every_byte_exactly(axes, local_tokens, remote_tokens):
    ratio, larger = B.pairing(local_tokens, remote_tokens)
    for part in range(1 if larger else ratio):
        runs = B.block_runs(axes, **shape(local_tokens, remote_tokens, part=part))
        assert check(axes, runs, local_tokens=local_tokens, remote_tokens=remote_tokens, part=part) is None
        assert sum(r.length for r in runs) == B.row_bytes(axes, sizes_of(axes, HEADS, local_tokens))


@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("local_tokens, remote_tokens", [(8, 4), (4, 8)])
@pytest.mark.parametrize("head_offset", [0, 2])
def test_block_runs_read_a_decode_ranks_heads(axes, local_tokens, remote_tokens, head_offset):
    """Decode TP 2 from prefill TP 1: this rank's 2 of the 4 heads."""
    runs = B.block_runs(axes, **shape(local_tokens, remote_tokens, local_heads=2, head_offset=head_offset))
    assert check(axes, runs, local_tokens=local_tokens, remote_tokens=remote_tokens, local_heads=2,
                 head_offset=head_offset) is None


@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("local_heads, head_offset", [(4, 0), (2, 0), (2, 2), (1, 3)])
@pytest.mark.parametrize("ratio", [1, 2, 4])
def test_staged_runs_then_restage_give_every_byte_exactly(axes, local_heads, head_offset, ratio):
    runs = B.staged_runs(axes, **shape(4 * ratio, 4, local_heads=local_heads, head_offset=head_offset))
    assert check(axes, runs, local_tokens=4 * ratio, remote_tokens=4, local_heads=local_heads,
                 head_offset=head_offset, staged=True) is None


# descriptors per local block, R = the ratio, with all heads (TP 1 -> 1) and with this rank's 2 of 4
# heads (1 -> 2): the closed forms docs/mechanism.md gives for each row layout
@pytest.mark.parametrize("axes, larger, smaller, larger_sliced, smaller_sliced", [
    ("HLNC", lambda r: r * HEADS * LAYERS, HEADS * LAYERS, lambda r: r * 2 * LAYERS, 2 * LAYERS),   # BHLNC
    ("LNHC", lambda r: r * LAYERS, LAYERS, lambda r: r * 4 * LAYERS, 4 * LAYERS),                   # BLNHC
    ("LHNC", lambda r: r * LAYERS * HEADS, LAYERS * HEADS, lambda r: r * LAYERS * 2, LAYERS * 2),   # BLHNC
    ("NHLC", lambda r: r, 1, lambda r: r * 4, 4),                                                   # token-outermost
])
@pytest.mark.parametrize("ratio", [2, 4])
def test_descriptor_counts(axes, larger, smaller, larger_sliced, smaller_sliced, ratio):
    """Local block R times the remote one: R remote blocks; R times smaller: a part of one.
    (4 local tokens: the sliced token-major rows need one run per token: 4.)"""
    assert B.descriptors_per_block(axes, **shape(4 * ratio, 4)) == larger(ratio)
    assert B.descriptors_per_block(axes, **shape(4, 4 * ratio)) == smaller
    assert B.descriptors_per_block(axes, **shape(4 * ratio, 4, local_heads=2, head_offset=2)) == larger_sliced(ratio)
    assert B.descriptors_per_block(axes, **shape(4, 4 * ratio, local_heads=2, head_offset=2)) == smaller_sliced


@pytest.mark.parametrize("axes, whole, sliced", [
    ("HLNC", 1, 1),            # BHLNC: a rank's heads are one range of the remote row
    ("LNHC", 1, LAYERS * 4),   # BLNHC: heads inside every token
    ("LHNC", 1, LAYERS),       # BLHNC: heads inside every layer
    ("NHLC", 1, 4),            # token-outermost: heads inside every token
])
@pytest.mark.parametrize("ratio", [2, 4])
def test_staged_descriptor_counts(axes, whole, sliced, ratio):
    """Staged: per remote block one descriptor where the heads read are one range of its row."""
    assert B.descriptors_per_block(axes, staged=True, **shape(4 * ratio, 4)) == ratio * whole
    assert B.descriptors_per_block(axes, staged=True, **shape(4 * ratio, 4, local_heads=2, head_offset=2)) == \
        ratio * sliced


def test_equal_block_sizes_are_one_run():
    assert B.block_runs("HLNC", **shape(4, 4)) == [B.Run(0, 0, 0, B.row_bytes("HLNC", sizes_of("HLNC", HEADS, 4)))]


def test_staged_order():
    assert B.staged_order("HLNC", 2) == (("R", "H", "L", "N", "C"), (1, 2, 0, 3, 4))
    assert B.staged_order("LNHC", 2) == (("R", "L", "N", "H", "C"), (1, 0, 2, 3, 4))
    assert B.staged_order("NHLC", 4) == (("R", "N", "H", "L", "C"), (0, 1, 2, 3, 4))  # nothing moves


@pytest.mark.parametrize("bad", [
    dict(local_tokens=12, remote_tokens=8),               # neither divides the other
    dict(local_tokens=4, remote_tokens=8, part=2),        # a remote block of 2 parts
    dict(local_tokens=8, remote_tokens=4, local_heads=2, head_offset=3),  # heads 3..4 of 4
])
def test_block_runs_refuse_impossible_pairings(bad):
    kw = dict(shape(bad.pop("local_tokens"), bad.pop("remote_tokens")), **bad)
    with pytest.raises(ValueError):
        B.block_runs("HLNC", **kw)


def test_staged_runs_need_the_local_block_larger():
    with pytest.raises(ValueError, match="whole remote blocks"):
        B.staged_runs("HLNC", **shape(4, 8))


@pytest.mark.parametrize("axes", ["HL", "HLCN", "HLNNC", "HXNC"])
def test_bad_axes(axes):
    with pytest.raises(ValueError):
        B.block_runs(axes, **shape(8, 4))


# --------------------------------------------------------------------------- planted faults
# The check above is trusted because it fails on each of these: a run reading the wrong remote
# block, one shifted by a content row, a lost run, a staged row restaged with the parts inside
# the tokens, and heads read from the wrong offset.

def _plant(runs, i, **change):
    runs = list(runs)
    runs[i] = runs[i]._replace(**change)
    return runs


@pytest.mark.parametrize("axes", ["HLNC", "LNHC", "NHLC"])
def test_check_catches_planted_faults(axes, monkeypatch):
    kw = dict(local_tokens=8, remote_tokens=4)
    runs = B.block_runs(axes, **shape(8, 4))
    assert check(axes, runs, **kw) is None
    last = len(runs) - 1
    assert check(axes, _plant(runs, last, remote=1 - runs[last].remote), **kw)                  # other block
    shifted = _plant(runs, 0, remote_offset=runs[0].remote_offset + CONTENT)
    assert check(axes, shifted, **kw)                                                           # shifted
    assert check(axes, runs[:-1], **kw)                                                         # a run lost
    staged = B.staged_runs(axes, **shape(8, 4))
    assert check(axes, staged, staged=True, **kw) is None
    if axes[0] != "N":  # a token-outermost row stages in place: there is no order to get wrong
        assert check(axes, staged, **kw)  # staged but never restaged
        with monkeypatch.context() as m:  # the parts taken inside the tokens instead of outside
            m.setattr(B, "restage", _restage_parts_inside)
            assert check(axes, staged, staged=True, **kw)
    sliced = B.block_runs(axes, **shape(8, 4, local_heads=2, head_offset=2))
    assert check(axes, sliced, local_tokens=8, remote_tokens=4, local_heads=2, head_offset=2) is None
    assert check(axes, sliced, local_tokens=8, remote_tokens=4, local_heads=2, head_offset=0)  # wrong heads


def _restage_parts_inside(row, axes, sizes, ratio):
    """A wrong restage: local token t taken as part t % ratio, token t // ratio (parts inside)."""
    staged_sizes = dict(sizes, N=sizes["N"] // ratio, R=ratio)
    names = "R" + axes
    out = [None] * len(row)
    for idx in product(*(range(sizes[a]) for a in axes)):
        c = dict(zip(axes, idx))
        s = dict(c, R=c["N"] % ratio, N=c["N"] // ratio)
        out[offset(axes, sizes, c)] = row[offset(names, staged_sizes, s)]
    return out


# --------------------------------------------------------------------------- the kept CPU-harness runs
# experiments/results/2026-11-29-block-sizes-cpu-0.33.0.json (real vLLM 0.33.0 + NIXL, the harness's 4-layer
# model with 2 KV heads): the descriptors per decode block of each full request are what this module says

RESULTS = __import__("pathlib").Path(__file__).resolve().parents[2] / "experiments" / "results"


def _row(doc, name):
    (row,) = [r for r in doc["rows"] if r["name"] == name]
    return row


@pytest.mark.parametrize("name, axes, ratio, local_heads", [
    ("bhlnc-restage-dense-tp1-16-32", "HLNC", 2, 2),
    ("bhlnc-restage-dense-tp1-16-64", "HLNC", 4, 2),
    ("flagdiff-restage-dense-tp1to2-16-32", "HLNC", 2, 1),   # decode TP 2: one of the two heads per rank
    ("flagdiff-restage-dense-tp1-16-64", "HLNC", 4, 2),
])
def test_the_harness_runs_moved_the_staged_descriptor_count_exactly(name, axes, ratio, local_heads):
    import json
    doc = json.loads((RESULTS / "2026-11-29-block-sizes-cpu-0.33.0.json").read_text())
    row = _row(doc, name)
    assert row["transfer_verified"] is True and row["outcome"] == "bytes exact on every decode rank"
    want = B.descriptors_per_block(axes, staged=True, layers=4, heads=2, content_bytes=256, local_tokens=16 * ratio,
                                   remote_tokens=16, local_heads=local_heads, head_offset=0)
    case = row["cases"]["bs-full"]
    assert want == ratio and case["xfer_descs_per_block"] == want
    for rank in case.get("ranks") or []:
        assert rank["xfer_descs_per_block"] == want and rank["bytes_ok"]
    # stock (LBHNC, one region per layer) moved R per layer: the same pairing at R x 4
    stock = _row(doc, name.replace("flagdiff-restage", "stock").replace("bhlnc-restage", "stock"))
    assert stock["transfer_verified"] is True and stock["cases"]["bs-full"]["xfer_descs_per_block"] == ratio * 4
