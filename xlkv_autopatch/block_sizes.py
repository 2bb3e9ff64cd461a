"""Different block sizes on prefill and decode: which byte ranges of the remote cross-layer block
rows make up one local block row.  Pure Python, no vLLM, no torch.

A block row (one KV block of every layer, vLLM >= 0.29's block-outermost layouts) is a dense
array whose axes, outermost first, are a permutation of

  ``H`` KV heads (of this TP rank), ``L`` layers, ``N`` tokens, ``C`` one head's content of one
  token (K and V packed: bytes; always innermost)

plus, on 0.12-0.25's FlashAttention cross-layer block, ``K`` (K/V, 2).  ``ROW_AXES`` names the row
axes of vLLM's layouts.  Where the local (decode) block holds ``ratio`` times the remote (prefill)
block's tokens, local token ``t`` comes from remote block ``t // remote_tokens`` of the ``ratio``
listed for it, token ``t % remote_tokens``; where it holds ``1 / ratio`` of them, local block ``q``
of a remote block's ``ratio`` parts takes its tokens ``q * local_tokens + t``.  The heads a local
rank reads are ``local_heads`` consecutive remote heads from ``head_offset`` (decode TP a multiple
of prefill TP; vLLM serves different block sizes only there).

Two ways to move it (docs/mechanism.md, "Different block sizes on prefill and decode"):

* ``block_runs``: every byte straight to its place, each run contiguous on both sides (the
  fewest such runs, in local order): the descriptors per local block NIXL needs without any copy
  on decode;
* ``staged_runs`` + ``restage``: each remote block's rows (its head range) read whole into the
  ``ratio`` equal parts of the local row, in remote-row order, then one permutation of the row
  on decode (``staged_order``) puts every token in place: ``ratio`` descriptors per local block
  where the heads a rank reads are one range of the remote row (``H`` outermost, or every head),
  which is what vLLM's own remote-block-granularity transfer plus its receive post-process do
  per layer for its ``LB*`` layouts.
"""

from collections import namedtuple
from itertools import product
from typing import Dict, List, Optional, Sequence, Tuple

#: the row axes (outermost first) of vLLM >= 0.29's block-outermost KV cache layouts, and of a
#: token-outermost row, which vLLM does not have (``NHLC``: the fewest descriptors, no TP slicing)
ROW_AXES = {"BHLNC": "HLNC", "BLNHC": "LNHC", "BLHNC": "LHNC"}

#: one descriptor: ``length`` bytes from ``remote_offset`` in remote block ``remote`` (its index
#: among the remote blocks that make up the local block: 0 where the local block is smaller) to
#: ``local_offset`` in the local block row
Run = namedtuple("Run", "remote remote_offset local_offset length")


def pairing(local_tokens: int, remote_tokens: int) -> Tuple[int, bool]:
    """(ratio, local block larger) for two block sizes; ValueError where neither divides the other."""
    if local_tokens <= 0 or remote_tokens <= 0:
        raise ValueError("block sizes %d and %d" % (local_tokens, remote_tokens))
    if local_tokens % remote_tokens == 0:
        return local_tokens // remote_tokens, True
    if remote_tokens % local_tokens == 0:
        return remote_tokens // local_tokens, False
    raise ValueError("local %d-token and remote %d-token blocks: neither size divides the other"
                     % (local_tokens, remote_tokens))


def _check_axes(axes: str, sizes: Dict[str, int]) -> None:
    if not axes or axes[-1] != "C" or sorted(axes) != sorted(set(axes)) or not {"H", "L", "N", "C"} <= set(axes):
        raise ValueError("row axes %r: want H, L, N once each and C last (K optional)" % (axes,))
    if set(axes) - {"H", "L", "N", "C", "K"}:
        raise ValueError("row axes %r: unknown axis" % (axes,))
    for a in axes:
        if a != "N" and sizes.get(a, 0) <= 0:
            raise ValueError("row axes %r: no size for %s" % (axes, a))


def _strides(axes: str, sizes: Dict[str, int]) -> Dict[str, int]:
    strides, step = {}, 1
    for a in reversed(axes):
        strides[a] = step
        step *= sizes[a]
    return strides


def row_bytes(axes: str, sizes: Dict[str, int]) -> int:
    """Bytes of one block row (``sizes``: every axis, ``N`` the tokens, ``C`` in bytes)."""
    total = 1
    for a in axes:
        total *= sizes[a]
    return total


def _shapes(axes, layers, heads, content_bytes, local_tokens, remote_tokens, local_heads, kv):
    remote = {"H": heads, "L": layers, "N": remote_tokens, "C": content_bytes}
    if "K" in axes:
        remote["K"] = kv
    local = dict(remote, H=local_heads if local_heads is not None else heads, N=local_tokens)
    _check_axes(axes, remote)
    if not 0 < local["H"] <= heads:
        raise ValueError("%d local heads of %d remote heads" % (local["H"], heads))
    return local, remote


def _source(coords, ratio, larger, remote_tokens, local_tokens, part, head_offset):
    """(remote block index, remote coordinates) of one local cell."""
    src = dict(coords)
    n = coords["N"]
    if larger:
        block, src["N"] = n // remote_tokens, n % remote_tokens
    else:
        block, src["N"] = 0, part * local_tokens + n
    src["H"] = coords["H"] + head_offset
    return block, src


def _merge(runs: List[Run], run: Run) -> None:
    if runs:
        last = runs[-1]
        if (last.remote == run.remote and last.local_offset + last.length == run.local_offset
                and last.remote_offset + last.length == run.remote_offset):
            runs[-1] = last._replace(length=last.length + run.length)
            return
    runs.append(run)


def block_runs(axes: str, *, layers: int, heads: int, content_bytes: int, local_tokens: int,
               remote_tokens: int, part: int = 0, local_heads: Optional[int] = None, head_offset: int = 0,
               kv: int = 2) -> List[Run]:
    """The byte ranges of the remote block rows that make up one local block row, each contiguous on
    both sides, in local order, merged wherever both sides continue: the fewest descriptors that
    move the block without a copy on decode.  ``heads``: the remote row's KV heads; ``local_heads``
    (default: the same) of them, from ``head_offset``, are the local row's; ``part``: which of a
    larger remote block's parts the local block is; ``kv``: the ``K`` axis's size where the row has one."""
    ratio, larger = pairing(local_tokens, remote_tokens)
    if not larger and not 0 <= part < ratio:
        raise ValueError("part %d of a remote block of %d parts" % (part, ratio))
    local, remote = _shapes(axes, layers, heads, content_bytes, local_tokens, remote_tokens, local_heads, kv)
    if head_offset < 0 or head_offset + local["H"] > heads:
        raise ValueError("heads %d..%d of %d" % (head_offset, head_offset + local["H"] - 1, heads))
    ls, rs = _strides(axes, local), _strides(axes, remote)
    outer = axes[:-1]
    runs: List[Run] = []
    for idx in product(*(range(local[a]) for a in outer)):
        coords = dict(zip(outer, idx))
        block, src = _source(coords, ratio, larger, remote_tokens, local_tokens, part, head_offset)
        _merge(runs, Run(block, sum(src[a] * rs[a] for a in outer), sum(coords[a] * ls[a] for a in outer),
                         content_bytes))
    return runs


def staged_runs(axes: str, *, layers: int, heads: int, content_bytes: int, local_tokens: int,
                remote_tokens: int, local_heads: Optional[int] = None, head_offset: int = 0,
                kv: int = 2) -> List[Run]:
    """Local block larger only: each remote block's head range read into its part of the local row
    (part ``j`` of ``ratio`` equal parts holds remote block ``j``'s rows of the local heads, in the
    remote row's order), merged like ``block_runs``: one run per remote block where those heads are
    one range of the remote row.  ``restage`` then puts the tokens in place."""
    ratio, larger = pairing(local_tokens, remote_tokens)
    if not larger:
        raise ValueError("staging needs the local block to hold whole remote blocks (local %d, remote %d tokens)"
                         % (local_tokens, remote_tokens))
    local, remote = _shapes(axes, layers, heads, content_bytes, local_tokens, remote_tokens, local_heads, kv)
    if head_offset < 0 or head_offset + local["H"] > heads:
        raise ValueError("heads %d..%d of %d" % (head_offset, head_offset + local["H"] - 1, heads))
    part_shape = dict(local, N=remote_tokens)
    ps, rs = _strides(axes, part_shape), _strides(axes, remote)
    part_len = row_bytes(axes, part_shape)
    outer = axes[:-1]
    runs: List[Run] = []
    for block in range(ratio):
        for idx in product(*(range(part_shape[a]) for a in outer)):
            coords = dict(zip(outer, idx))
            src = dict(coords, H=coords["H"] + head_offset)
            _merge(runs, Run(block, sum(src[a] * rs[a] for a in outer),
                             block * part_len + sum(coords[a] * ps[a] for a in outer), content_bytes))
    return runs


def staged_order(axes: str, ratio: int) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    """The permutation ``restage`` applies: view the staged row as ``(R,) + axes`` (``N`` the remote
    block's tokens, ``R`` the ``ratio`` parts), move ``R`` just outside ``N``; the result, with ``R``
    and ``N`` merged, is the local row.  Returns (the staged view's axis names, the permutation of
    its dimensions), e.g. ``HLNC`` -> (("R", "H", "L", "N", "C"), (1, 2, 0, 3, 4))."""
    _check_axes(axes, {a: 1 for a in axes})
    if ratio < 1:
        raise ValueError("ratio %d" % ratio)
    names = ("R",) + tuple(axes)
    perm = []
    for i, a in enumerate(axes):
        if a == "N":
            perm.append(0)
        perm.append(i + 1)
    return names, tuple(perm)


def restage(staged: Sequence, axes: str, *, sizes: Dict[str, int], ratio: int) -> list:
    """The local row from a staged one (a sequence of ``row_bytes`` elements, one per byte):
    ``staged_order`` done element by element (the specification a tensor permute must meet).
    ``sizes``: the local row's axes (``N`` the local block's tokens, ``C`` in bytes)."""
    _check_axes(axes, sizes)
    if sizes["N"] % ratio:
        raise ValueError("%d tokens in %d parts" % (sizes["N"], ratio))
    names, perm = staged_order(axes, ratio)
    staged_sizes = dict(sizes, N=sizes["N"] // ratio, R=ratio)
    ss = _strides("".join(names), staged_sizes)
    permuted = [names[p] for p in perm]  # the order of the local row's axes, R inside it
    out = [None] * row_bytes(axes, sizes)
    if len(staged) != len(out):
        raise ValueError("a staged row of %d bytes, the local row has %d" % (len(staged), len(out)))
    i = 0
    for idx in product(*(range(staged_sizes[a]) for a in permuted)):
        coords = dict(zip(permuted, idx))
        out[i] = staged[sum(coords[a] * ss[a] for a in names)]
        i += 1
    return out


def descriptors_per_block(axes: str, *, staged: bool = False, **shape) -> int:
    """Descriptors one local block needs (``block_runs``, or ``staged_runs`` with ``staged``); a
    local block smaller than the remote one: the same for every ``part``, part 0's count."""
    if staged:
        return len(staged_runs(axes, **shape))
    return len(block_runs(axes, **shape))
