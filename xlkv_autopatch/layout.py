"""Cross-layer layout arithmetic and decisions: pure Python, no vLLM, no torch.

The vLLM glue in :mod:`xlkv_autopatch.patches` gathers facts from vLLM objects and asks
these functions what to do, so the rules are unit-tested on their own.
"""

import hashlib
import re
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

#: vLLM >= 0.29 layout that makes every block one contiguous row covering all layers, with
#: the per-layer page in FlashAttention's natural token-major order (N, H, C): what xlkv requests
#: for MLA (one latent "head", replicated on every TP rank; vLLM's NixlConnector asks for none)
BLOCK_OUTERMOST_LAYOUT = "BLNHC"
#: vLLM >= 0.29 block-outermost layout with the KV heads outermost inside the row ([B, H, L, N, C]):
#: one head's data for every layer is one contiguous run, so a TP rank's heads are one range of a
#: row, at any TP pairing; what xlkv requests for every model whose KV heads are split over ranks
HEADS_OUTERMOST_LAYOUT = "BHLNC"
#: The block-outermost layouts NIXL registers as a single whole-row region (BLHNC, also
#: block-outermost, keeps one region per layer).
WHOLE_ROW_LAYOUTS = ("BLNHC", "BHLNC")

HASH_TAG = "xlkv-cross-layer-v2"
#: Readable start of the hash an xlkv cross-layer engine publishes: vLLM prints the remote
#: hash in its own mismatch error, so a peer *without* the shim names the cause too.
HASH_PREFIX = "xlkv-cross-layer-KV-layout.sent-by-an-engine-with-ENABLE_XLKV=true."


@dataclass(frozen=True)
class Decision:
    use: bool
    reason: str


def cross_layer_decision(
    *,
    backend: str,
    kv_layout: Optional[str],
    allowed_backends: Sequence[str],
    has_mamba: bool = False,
    num_kv_groups: int = 1,
    host_buffer: bool = False,
    explicit_opt_in: Optional[str] = None,
    env_layout: Optional[str] = None,
) -> Decision:
    """Should this worker use one cross-layer KV tensor (vLLM 0.12-0.28)?

    Mirrors the guards upstream vLLM applies to its own opt-in (backend allow-list, HND
    layout, no Mamba) plus the ones the shim needs (one KV group, no host buffer); the
    model's family (MLA and the rest) is decided by :func:`xlkv_autopatch.families.decide`.  ``explicit_opt_in`` is the user's ``enable_cross_layers_blocks`` value, if
    any: an explicit false wins over ENABLE_XLKV.  ``env_layout``: the user's
    ``VLLM_KV_CACHE_LAYOUT``, named when it is what makes the layout other than HND.
    """
    if explicit_opt_in is not None and str(explicit_opt_in).strip().lower() != "true":
        return Decision(False, "kv_connector_extra_config sets enable_cross_layers_blocks=%s" % explicit_opt_in)
    if has_mamba:
        return Decision(False, "hybrid Mamba/SSM models keep the stock layout")
    if num_kv_groups != 1:
        return Decision(False, "%d KV cache groups (hybrid attention); cross-layer needs exactly one" % num_kv_groups)
    if backend not in allowed_backends:
        return Decision(False, "attention backend %s is not in %s" % (backend, ", ".join(allowed_backends)))
    if kv_layout != "HND":
        if env_layout and env_layout.strip().upper() == str(kv_layout).upper():
            return Decision(False, "VLLM_KV_CACHE_LAYOUT=%s is set explicitly, and cross-layer blocks need the HND "
                                   "layout (unset it, or set it to HND)" % env_layout)
        return Decision(False, "KV cache layout is %s; cross-layer blocks need HND" % kv_layout)
    if host_buffer:
        return Decision(False, "host-buffer mode (kv_buffer_device differs from the device) copies per layer")
    return Decision(True, "backend %s, HND layout, one KV group" % backend)


def explicit_layout_reason(env_layout: str) -> str:
    return "VLLM_KV_CACHE_LAYOUT=%s is set explicitly and wins" % env_layout


#: the values vLLM accepts for VLLM_KV_CACHE_LAYOUT (its envs.py ``env_with_choices``: compared as written,
#: case and blanks included; anything else, an empty value too, stops vLLM with "Invalid value ..." where it
#: reads the variable), by whether the release's mechanism is "layout" (0.29+; 0.12-0.28 know NHD and HND only)
VLLM_LAYOUT_VALUES = {False: ("NHD", "HND"),
                      True: ("LBNHC", "LBHNC", "LHBNC", "NHD", "HND", "BLHNC", "BLNHC", "BHLNC")}


def invalid_layout_value(env_layout: Optional[str], *, mechanism: str, release: str = "") -> Optional[str]:
    """Why vLLM refuses this ``VLLM_KV_CACHE_LAYOUT`` value (None: unset, or a value it accepts): vLLM
    compares the value exactly as written with its list (``VLLM_LAYOUT_VALUES``) and stops with
    ``ValueError: Invalid value '<value>' for VLLM_KV_CACHE_LAYOUT`` where it reads it, with or without
    xlkv.  The fix names the accepted spelling where the value is one up to case and blanks."""
    if env_layout is None:
        return None
    allowed = VLLM_LAYOUT_VALUES[mechanism == "layout"]
    if env_layout in allowed:
        return None
    near = env_layout.strip().upper()
    fix = ("set VLLM_KV_CACHE_LAYOUT=%s (capitals, no blanks) or unset it" % near if near in allowed else
           "set it to one of those values or unset it")
    return ("VLLM_KV_CACHE_LAYOUT=%r is not a value vLLM%s accepts (it compares the value as written, case and "
            "blanks included, with %s): vLLM stops at start-up with \"Invalid value %r for VLLM_KV_CACHE_LAYOUT\", "
            "with or without ENABLE_XLKV. Fix: %s" % (env_layout, " " + release if release else "",
                                                       ", ".join(allowed), env_layout, fix))


def kernel_split_of(reason: str) -> Optional[Tuple[int, int]]:
    """(kernel block, KV block) of a reason :func:`kernel_split_reason` wrote, or None for any other reason."""
    m = re.match(r"the attention kernel block \((\d+) tokens\) is smaller than the KV block \((\d+) tokens\)",
                 reason or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def kernel_split_reason(kernel_block_size: int, block_size: int) -> Optional[str]:
    """vLLM >= 0.29: why an attention kernel block smaller than the KV block keeps the stock layout (vLLM's
    NIXL registration cannot split a block-outermost layout into kernel blocks), or None."""
    if kernel_block_size < block_size:
        return ("the attention kernel block (%d tokens) is smaller than the KV block (%d tokens), and vLLM's NIXL "
                "registration cannot split a block-outermost layout into kernel blocks" % (kernel_block_size,
                                                                                         block_size))
    return None


#: vLLM's aliases of VLLM_KV_CACHE_LAYOUT values (0.29+ envs.py)
LAYOUT_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}


def layout_name(value: str) -> str:
    """The KV-cache layout a VLLM_KV_CACHE_LAYOUT value names (vLLM's aliases resolved)."""
    value = value.strip().upper()
    return LAYOUT_ALIASES.get(value, value)


def explicit_layout(env_layout: Optional[str]) -> Optional[Decision]:
    """vLLM >= 0.29 with an explicit ``VLLM_KV_CACHE_LAYOUT``: vLLM never asks the connector, so the
    variable decides.  None where it is unset; else ``use``: the layout is one xlkv registers and
    tags (a whole-row one), with what the engine then runs in ``reason``."""
    if not env_layout or not env_layout.strip():
        return None
    name = layout_name(env_layout)
    why = explicit_layout_reason(env_layout)
    if name == HEADS_OUTERMOST_LAYOUT:
        return Decision(True, "%s: the layout xlkv requests for models whose KV heads are split over ranks" % why)
    if name in WHOLE_ROW_LAYOUTS:
        return Decision(True, "%s: token-major block rows (1 descriptor per block; heterogeneous TP is refused, the "
                              "heads are not outermost in the row)" % why)
    return Decision(False, "%s: this engine runs %s, one NIXL region per layer (unset it for xlkv's layout)"
                    % (why, name))


def layout_decision(*, stock: Optional[str], env_layout: Optional[str]) -> Decision:
    """Whether to ask vLLM >= 0.29 for the block-outermost layout the model's family chose
    (:func:`xlkv_autopatch.families.decide`).  ``stock`` is what NixlConnector asked for (None
    for MLA models, which it leaves to vLLM's default)."""
    if env_layout:
        return Decision(False, explicit_layout_reason(env_layout))
    return Decision(True, "instead of %s: one contiguous row per block across all layers"
                    % (stock or "vLLM's default"))


def remote_cross_layer(*, local_cross: bool, local_regions: int, remote_regions: int,
                       local_layout: Optional[str] = None, remote_layout: Optional[str] = None) -> Optional[bool]:
    """Does the peer's registered layout differ from this worker's?  None where they agree,
    else whether the peer's is the cross-layer one.

    vLLM >= 0.29 publish their KV-cache layout name: a whole-row layout is cross-layer.  Older
    releases publish the registered regions: a cross-layer tensor is 1 region (2 for K/V on
    blocks-first backends), the stock layout one per layer (and K/V), so a different region
    count on the same model is the other layout.
    """
    if local_layout and remote_layout:
        remote = remote_layout in WHOLE_ROW_LAYOUTS
        return None if remote == (local_layout in WHOLE_ROW_LAYOUTS) else remote
    if local_regions == remote_regions:
        return None
    return not local_cross


def infer_kernel_block_size(numel: int, num_blocks: int, num_layers: int, num_kv_heads: int, head_size: int,
                            kv_factor: int = 2) -> int:
    """Kernel block size of a cross-layer tensor from its element count.

    Raises ValueError when the numbers do not describe a whole tensor.
    """
    per_token = num_layers * num_kv_heads * head_size * kv_factor
    denom = num_blocks * per_token
    if num_blocks <= 0 or per_token <= 0 or numel % denom:
        raise ValueError(
            "cross-layer tensor of %d elements is not %d blocks x %d layers x %d heads x %d x %d"
            % (numel, num_blocks, num_layers, num_kv_heads, head_size, kv_factor)
        )
    return numel // denom


def registration_view_shape(numel: int, num_blocks: int, kernel_block_size: int,
                            block_size_position: int) -> Tuple[int, ...]:
    """A 4-D shape with the same elements that a per-layer-minded register_kv_caches
    (vLLM 0.12-0.15) reads correctly: ``shape[0]`` is the block count and
    ``shape[block_size_position]`` the kernel block size, so one region of
    ``numel // num_blocks`` elements per block is registered."""
    if block_size_position not in (-2, -3):
        raise ValueError("unsupported block_size_position %r" % (block_size_position,))
    per_block = numel // num_blocks
    if numel % num_blocks or per_block % kernel_block_size:
        raise ValueError("%d elements do not split into %d blocks of %d tokens" % (numel, num_blocks, kernel_block_size))
    rest = per_block // kernel_block_size
    if block_size_position == -3:
        return (num_blocks, kernel_block_size, 1, rest)
    return (num_blocks, 1, kernel_block_size, rest)


def reconcile_block_counts(region_blocks: Dict[str, int], expected: int) -> Tuple[int, Optional[str]]:
    """Pick the block count NIXL must register and index.

    ``region_blocks`` maps each region (layer, or K/V of a layer) to the real size of its
    block dimension; ``expected`` is the worker's budget (``kv_cache_config.num_blocks``
    times the kernel ratio).  Returns ``(count, note)``: the tensors' real count (which
    may exceed the budget: virtual over-allocation) and a note when it differs.  Raises
    ValueError when tensors disagree or hold fewer blocks than the budget.
    """
    counts = set(region_blocks.values())
    if not counts:
        raise ValueError("no KV cache tensors to register")
    if len(counts) > 1:
        detail = ", ".join("%s=%d" % kv for kv in sorted(region_blocks.items())[:8])
        raise ValueError("KV cache tensors disagree on their block count (%s)" % detail)
    (real,) = counts
    if real < expected:
        raise ValueError("KV cache tensors hold %d blocks but the worker indexes %d" % (real, expected))
    if real > expected:
        return real, "tensors hold %d blocks, the scheduler budget is %d: registering all %d" % (real, expected, real)
    return real, None


#: ``tag_hash``'s ``registration`` of an xlkv before 0.7.0 at one KV head per tensor-parallel rank
#: (BLNHC rows that xlkv had vLLM register as one region each): only recognised, to name such a peer
ROW_AT_ONE_KV_HEAD = "row-at-one-kv-head"
#: ``tag_hash``'s ``registration`` of a worker that registered HEADS_OUTERMOST_LAYOUT rows as one
#: region each (at any KV heads per rank; patches/page_contiguous.py): the same on both sides of any
#: TP pairing, different from every per-layer or token-major registration of the same model
HEADS_OUTERMOST_ROWS = "heads-outermost-rows"


def tag_hash(stock_hash: str, registration: Optional[str] = None) -> str:
    """The compatibility hash a worker publishes when it uses xlkv's cross-layer layout:
    a readable prefix, then a digest of the stock hash (so other models still differ) and, where
    xlkv changed how the rows are registered, of that registration (``ROW_AT_ONE_KV_HEAD``)."""
    text = "%s|%s" % (stock_hash, HASH_TAG) if registration is None else "%s|%s|%s" % (stock_hash, HASH_TAG,
                                                                                      registration)
    return HASH_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def row_tiling(offsets: Sequence[int], page_bytes: int, row_bytes: int) -> Optional[str]:
    """Do the layers' pages, at these byte offsets into a block's row, tile that row exactly
    (every byte of the row in exactly one page)?  None when they do, else why not.  An offset
    may repeat (two layers sharing one page): the distinct offsets count."""
    if page_bytes <= 0 or row_bytes <= 0:
        return "a page of %d bytes in a row of %d bytes" % (page_bytes, row_bytes)
    if row_bytes % page_bytes:
        return "a row of %d bytes is not a whole number of %d-byte pages" % (row_bytes, page_bytes)
    distinct = sorted(set(offsets))
    if distinct != list(range(0, row_bytes, page_bytes)):
        return ("the layers' pages start at byte offsets %s of each %d-byte row, not at every multiple of the "
                "%d-byte page" % (distinct[:8] + (["..."] if len(distinct) > 8 else []), row_bytes, page_bytes))
    return None


def column_major_page_strides(shape: Sequence[int], strides: Sequence[int]) -> Tuple[int, ...]:
    """Strides of a view with the same shape and the same bytes as a ``[blocks, 1, tokens, content]``
    view whose page is dense, that walks each page content-major (element ``(b, 0, n, c)`` at
    ``b * strides[0] + n + c * tokens``): a bijection onto the same page elements, but not a
    contiguous page (tokens > 1 and content > 1).  ValueError for any other shape."""
    if len(shape) != 4 or len(strides) != 4 or shape[1] != 1 or shape[2] < 2 or shape[3] < 2:
        raise ValueError("not a [blocks, 1, tokens > 1, content > 1] view: shape %s" % (tuple(shape),))
    if strides[3] != 1 or strides[2] != shape[3]:
        raise ValueError("the page of shape %s, strides %s is not dense" % (tuple(shape), tuple(strides)))
    return (strides[0], shape[2] * shape[3], 1, shape[2])


def heterogeneous_tp_supported(*, cross_layer: bool, blocks_first: bool, tp_ratio: int,
                               whole_row_layout: bool = False, packed_groups: bool = False,
                               heads_outermost_rows: bool = False, replicated: bool = False) -> Decision:
    """Can a worker read a peer with a different TP size with this layout?

    FlashAttention cross-layer blocks (0.12-0.28) are (heads, layers, K/V, tokens, dim) with heads
    outermost, and so are the >= 0.29 ``BHLNC`` rows that xlkv registers as one region each
    (``heads_outermost_rows``): one TP rank's heads are one contiguous slice of the block, and
    vLLM's rank-offset arithmetic (offset = head slot x local block length) stays correct.
    ``replicated``: the peer's KV is the same on every rank (MLA's latent cache): nothing is sliced.
    Blocks-first backends (K/V outermost), the token-major ``BLNHC`` rows and vLLM's packed
    multi-group layout (0.24-0.28: a block id's row is every layer's page one after the other) are
    not sliceable that way.
    """
    if tp_ratio in (1, -1) or not cross_layer:
        return Decision(True, "homogeneous TP" if tp_ratio in (1, -1) else "stock layout")
    if replicated:
        return Decision(True, "the KV cache is replicated on every tensor-parallel rank (MLA): one remote rank's "
                              "whole block is read, nothing is sliced by heads")
    if heads_outermost_rows:
        return Decision(True, "the KV heads are outermost in each %s block row: a remote rank's heads are one "
                              "range of the row, 1 descriptor per block per remote rank" % HEADS_OUTERMOST_LAYOUT)
    if packed_groups:
        return Decision(False, "vLLM's packed multi-group KV layout (one row per block id across every layer of "
                               "every KV cache group) cannot be sliced by heads for heterogeneous TP")
    if whole_row_layout:
        return Decision(False, "token-major block-outermost rows (%s: every layer's page whole, heads inside each "
                               "token) cannot be sliced by heads for heterogeneous TP" % BLOCK_OUTERMOST_LAYOUT)
    if blocks_first:
        return Decision(False, "cross-layer blocks of a blocks-first backend (K/V outermost) cannot be "
                               "sliced by heads for heterogeneous TP")
    return Decision(True, "heads are outermost in a FlashAttention cross-layer block")


def tp_ratio(local_tp: int, remote_tp: int) -> int:
    """vLLM's tp_ratio as a decode (local) worker sees a prefill (remote) peer: local // remote where the local
    TP is larger, minus remote // local where it is smaller (1 for equal sizes)."""
    return local_tp // remote_tp if local_tp >= remote_tp else -(remote_tp // local_tp)


def pair_served(release, *, local_tp: int, remote_tp: int, replicated: bool = False, backend: str = "FLASH_ATTN",
                heads_outermost_rows: bool = False, packed_groups: bool = False) -> Decision:
    """Can an engine with xlkv's cross-layer blocks read a peer at ``remote_tp`` on this release (facts
    ``release``): the one answer the NIXL handshake (patches/handshake.py) and ``status`` (model_report.pair,
    status_report.runtime_refusals) give.  vLLM 0.29+ (mechanism ``layout``): whole rows, sliceable where the
    engine's rows keep the KV heads outermost (``heads_outermost_rows``); 0.12-0.28: the attention ``backend``'s
    cross-layer block, sliceable where it keeps the heads outermost on this release, never for vLLM's packed
    multi-group rows.  ``replicated``: MLA's latent cache, read whole from one remote rank."""
    ratio = tp_ratio(local_tp, remote_tp)
    if release.mechanism == "layout":
        return heterogeneous_tp_supported(cross_layer=True, tp_ratio=ratio, blocks_first=False, whole_row_layout=True,
                                          heads_outermost_rows=heads_outermost_rows, replicated=replicated)
    blocks_first = sliced_by_heads(backend=backend, fa_heads_outermost=release.fa_heads_outermost) is not None
    return heterogeneous_tp_supported(cross_layer=True, tp_ratio=ratio, blocks_first=blocks_first,
                                      packed_groups=packed_groups, replicated=replicated)


def block_sizes_served(release, *, local_block_size: int, remote_block_size: int, local_tp: int = 1,
                       remote_tp: int = 1, mla: bool = False, sliding_window: bool = False,
                       heads_outermost_rows: bool = True, rows_why_not: Optional[str] = None,
                       restaged: bool = True) -> Tuple[Decision, Optional[int]]:
    """Can an engine with xlkv's cross-layer blocks (``local_block_size`` tokens each: the decode side)
    read a peer whose blocks hold ``remote_block_size`` tokens, on this release (facts ``release``), and
    at how many NIXL descriptors per local block per remote rank: the one answer the NIXL handshake
    (patches/handshake.py) and ``status --prefill-block-size`` give.  (Decision, descriptors or None).

    Served (vLLM 0.29+, mechanism ``layout``) where the local block holds a whole number R of remote
    blocks, prefill TP <= decode TP, the model is not MLA, no KV cache group keeps a sliding window,
    the local rows are xlkv's heads-outermost ``BHLNC`` rows, one region each whose heads tile them
    (``heads_outermost_rows``, ``rows_why_not``: why they do not), and the receive restage
    (patches/block_size_restage.py) is attached (``restaged``): vLLM reads each remote block's rows
    whole into one of R parts of the local row, R descriptors per local block per remote rank
    (block_sizes.staged_runs), and the restage puts the tokens in place.  Every other pairing is
    refused naming why; vLLM itself refuses the first and the third with or without xlkv."""
    if local_block_size == remote_block_size:
        return Decision(True, "the same block size on both sides"), 1
    if local_block_size % remote_block_size:
        return Decision(False, "vLLM reads a peer's blocks only where this engine's blocks hold a whole number of "
                               "them, so it refuses %d-token blocks here facing %d-token blocks there with or without "
                               "xlkv (AssertionError: Local block size %d is not divisible by remote block size %d)"
                        % (local_block_size, remote_block_size, local_block_size, remote_block_size)), None
    if release.mechanism != "layout":
        return Decision(False, "this vLLM's cross-layer block (all layers of a block together) cannot be re-split "
                               "into the peer's token ranges (vLLM 0.29+ serves it)"), None
    if remote_tp > local_tp:
        return Decision(False, "prefill TP %d > decode TP %d: vLLM refuses different block sizes there, with or "
                               "without xlkv" % (remote_tp, local_tp)), None
    if mla:
        return Decision(False, "MLA's %s rows are not restaged on receive" % BLOCK_OUTERMOST_LAYOUT), None
    if sliding_window:
        return Decision(False, "a sliding-window KV cache group: vLLM pairs its in-window blocks by position, which "
                               "with other block sizes cover other tokens (stock vLLM 0.33.0, prefill 16 -> decode 32 "
                               "tokens: the sliding-window layers' last 32 tokens arrived as zeros)"), None
    if not heads_outermost_rows or rows_why_not:
        return Decision(False, "this engine's rows are not xlkv's %s rows, one region each whose KV heads tile them%s"
                        % (HEADS_OUTERMOST_LAYOUT, (": " + rows_why_not) if rows_why_not else "")), None
    if not restaged:
        return Decision(False, "the receive restage of %s rows (block_size_restage.py) is not attached"
                        % HEADS_OUTERMOST_LAYOUT), None
    ratio = local_block_size // remote_block_size
    return Decision(True, "each %d-token remote block is read whole into one of %d parts of a %d-token %s row, "
                          "which the receive restage puts in token order: %d descriptors per block per remote rank"
                    % (remote_block_size, ratio, local_block_size, HEADS_OUTERMOST_LAYOUT, ratio)), ratio


#: the knob that keeps cross-layer blocks which cannot be sliced by KV heads (vLLM 0.12-0.28)
EQUAL_TP_KNOB = "XLKV_EQUAL_TP"


def sliced_by_heads(*, backend: str, fa_heads_outermost: bool) -> Optional[str]:
    """vLLM 0.12-0.28: None where this attention backend's cross-layer block keeps the KV heads
    outermost (FLASH_ATTN where the release's ``fa_heads_outermost`` column says so: a remote rank's heads
    are one range of the block), else why a remote rank's heads are not one range of it."""
    if backend == "FLASH_ATTN" and fa_heads_outermost:
        return None
    return ("%s's cross-layer blocks on this vLLM are blocks-first (K/V outside the KV heads), so a remote rank's "
            "KV heads are not one range of a block" % backend)


def cross_layer_regions(*, backend: str, whole_rows: bool = False, replicated: bool = False,
                        kv_split_regions: bool = True) -> int:
    """NIXL regions one block (id) of xlkv's cross-layer layout registers, before NIXL merges neighbours:
    1 for a whole-row layout (vLLM >= 0.29: ``whole_rows``), for a replicated latent cache (MLA: one
    latent page per layer, no K/V split) and for FLASH_ATTN's cross-layer block (K and V inside each
    block, whether or not its KV heads are outermost: 0.23-0.25's registered 1 region per block in the
    supported-releases matrix).  Another backend's block (blocks-first: TRITON_ATTN, FLASHINFER) is 2
    regions where the release registers K and V apart (``kv_split_regions``, the release table's column:
    0.12-0.25; the CPU harness with TRITON_ATTN and XLKV_EQUAL_TP=true registered 2 regions per block on
    0.21.0), else 1 (0.26.0: 1).  Without the release (``kv_split_regions`` left out) the larger count.  The
    lab's descriptor limit and ``status --model`` ask it."""
    if whole_rows or replicated or backend == "FLASH_ATTN":
        return 1
    return 2 if kv_split_regions else 1


def kept_for_any_tp(why: str) -> str:
    """The reason an engine keeps the stock layout although the flag is on: its cross-layer blocks
    (``why`` they cannot be sliced by heads) would refuse a peer at another TP size, which stock serves."""
    return ("every prefill/decode pair of tensor-parallel sizes is served this way (an engine cannot know its "
            "peers' TP size at start-up): %s. Where every peer runs this engine's tensor-parallel size, %s=true "
            "gives 1 descriptor per block (a peer at another TP size is then refused)" % (why, EQUAL_TP_KNOB))


def heads_tile_row(*, heads: int, head_stride: int, page_offsets: Sequence[int], page_bytes: int,
                   row_bytes: int) -> Optional[str]:
    """Are the ``heads`` of a heads-outermost block row one equal run each, tiling the row exactly?

    ``head_stride``: bytes from one head's data to the next in a layer's page (ignored at one
    head); ``page_offsets``: each layer's page start within the row (a page is ``heads`` runs of
    ``page_bytes / heads`` bytes, ``head_stride`` apart); ``row_bytes``: the block stride.  None when
    head h of every layer lies in ``[h * row / heads, (h + 1) * row / heads)`` and those ranges fill
    the row (no padding: a remote rank's slice at offset slot x local row length is then its heads),
    else why not.  Layers sharing a page (KV cache groups aliasing one row) count once.
    """
    if heads <= 0 or page_bytes <= 0 or row_bytes <= 0 or page_bytes % heads:
        return "%d KV heads in a page of %d bytes, a row of %d bytes" % (heads, page_bytes, row_bytes)
    per_head = page_bytes // heads
    if heads > 1 and head_stride * heads != row_bytes:
        return ("the KV heads are %d bytes apart in a %d-byte row of %d heads: the row is padded or its heads "
                "are not outermost" % (head_stride, row_bytes, heads))
    span = row_bytes // heads
    distinct = sorted(set(page_offsets))
    if distinct != list(range(0, span, per_head)):
        return ("the layers' pages start at byte offsets %s of each head's %d-byte run, not at every multiple of "
                "one head's %d-byte page" % (distinct[:8] + (["..."] if len(distinct) > 8 else []), span, per_head))
    return None


def remote_sources(*, prefill_tp: int, decode_tp: int, kv_heads: Optional[int], replicated: bool = False) -> Tuple[
        Optional[int], Optional[str]]:
    """(prefill ranks each decode rank reads a block from, None) for a TP pairing, or (None, why vLLM
    refuses it): one prefill rank where decode TP >= prefill TP or the KV cache is replicated (MLA);
    else prefill TP / decode TP ranks, fewer where several prefill ranks hold the same KV head (vLLM's
    GQA dedup); vLLM refuses prefill TP > decode TP where prefill TP exceeds the KV heads, and TP
    sizes that do not divide each other."""
    big, small = max(prefill_tp, decode_tp), min(prefill_tp, decode_tp)
    if small <= 0 or big % small:
        return None, "prefill TP %d and decode TP %d do not divide each other" % (prefill_tp, decode_tp)
    if replicated or decode_tp >= prefill_tp:
        return 1, None
    if kv_heads is None:
        return prefill_tp // decode_tp, None
    if prefill_tp > kv_heads:
        return None, ("prefill TP %d > decode TP %d with prefill TP above the model's %d KV heads (replicated heads "
                      "on prefill): vLLM refuses it, with or without xlkv" % (prefill_tp, decode_tp, kv_heads))
    return prefill_tp // decode_tp, None


def ascending_order(local_ids: Sequence[int]) -> Optional[list]:
    """The permutation that puts (local, remote) descriptor pairs in ascending local order
    (stable), or None when they already are (nothing to reorder).

    NIXL merges two consecutive descriptors of one transfer into one only where both the
    local and the remote address continue the previous descriptor's, in list order.  vLLM
    hands a request's block pairs in allocation order, and its free queue gives blocks back
    in reverse: runs contiguous on both sides arrive descending and stay one descriptor per
    block.  Pairs are independent copies, so any permutation applied to both lists moves
    the same bytes; ascending local order makes every run that is contiguous in the same
    direction on both sides adjacent and increasing, which is all NIXL's merge needs.
    """
    if hasattr(local_ids, "argsort") and getattr(local_ids, "ndim", 0) == 1:  # a numpy array, as vLLM passes
        if len(local_ids) < 2 or bool((local_ids[:-1] <= local_ids[1:]).all()):
            return None
        return local_ids.argsort(kind="stable")
    ids = list(local_ids)
    if all(a <= b for a, b in zip(ids, ids[1:])):
        return None
    return sorted(range(len(ids)), key=ids.__getitem__)


def merged_descriptor_count(local_ids: Sequence[int], remote_ids: Sequence[int]) -> int:
    """How many descriptors NIXL's merge leaves for these pairs in this order, with one
    block per descriptor index (the cross-layer layout): a new descriptor starts wherever
    the local or the remote index does not continue the previous one by +1."""
    if len(local_ids) != len(remote_ids):
        raise ValueError("%d local and %d remote descriptors" % (len(local_ids), len(remote_ids)))
    count = 0
    prev = None
    for pair in zip(local_ids, remote_ids):
        if prev is None or pair[0] != prev[0] + 1 or pair[1] != prev[1] + 1:
            count += 1
        prev = pair
    return count
