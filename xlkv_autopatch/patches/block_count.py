"""NixlConnectorWorker.register_kv_caches: reconcile virtual and physical block counts.

Why
    NIXL descriptors are indexed ``region * num_blocks + block``: the block count the
    worker registers and indexes must be every registered tensor's real block dimension
    (in kernel blocks when the kernel block is smaller than the logical one).  vLLM
    0.18+ take the count from the scheduler's budget (``kv_cache_config.num_blocks``
    times the kernel ratio) and assert it equals the tensor's; allocators that
    over-allocate virtual capacity (kvcached) hand over tensors with more blocks.  A
    mismatch discovered after metadata is published would make the two sides index
    different bytes.
How
    The counts are checked only where xlkv's cross-layer layout is being registered (the
    0.12-0.15 redirect; 0.16-0.28 when xlkv made this process's connector prefer
    cross-layer blocks and one tensor arrives; 0.29+ when the worker's KV layout is a
    whole-row one).  Where xlkv kept the stock layout (MLA, hybrid, host pools, HiSparse
    host regions, any fallback) or decided nothing, registration is vLLM's, untouched.
    For a cross-layer registration, before the original runs, the wrapper reads each
    region's block dimension (cross-layer tensors and >= 0.26 packed tensors as one
    region; 0.29+ views count logical blocks, each holding several kernel blocks when the
    kernel block is smaller) and: refuses regions that disagree, except on releases that
    index every region by its own count (0.29+ workers with ``region_num_blocks``), and
    regions holding fewer blocks than the budget; on 0.18-0.28, where both counts live in
    ``num_blocks`` / ``_logical_num_blocks``, raises them to the tensors' real count
    (INFO line); on 0.29+ (per-layer counts come from the KV cache config) refuses
    over-allocation instead.  An assertion of vLLM's own registration under xlkv's
    block-outermost layout (0.29+: e.g. a view it cannot partition into NIXL regions) is
    re-raised naming the layout, the failed check and the fix; where the views' storage holds
    whole blocks beyond the views (0.29+ build views of the budget's size over an over-allocated
    tensor, so only the storage shows it), it names the over-allocation instead.  After
    registration it logs the regions, layout and KV cache groups once (a WARNING where vLLM
    registered a block-outermost layout as more than one region), and the worker's NIXL
    transfers get their descriptor order (transfer_order.py), whatever layout it registered.
vLLM versions
    0.12+ (owner: NixlConnectorWorker, NixlBaseConnectorWorker from 0.24).
Removal
    When vLLM derives the registered block count from the tensors.
"""

import traceback

from .. import facts, layout
from ..errors import XlkvRegistrationError
from ..logs import info_once, logger
from ..specs import NIXL_WORKER_CLASS, NIXL_WORKER_MODULE, Target
from . import _state, transfer_order
from ._args import bind


def _regions(value):
    if isinstance(value, (list, tuple)):  # 0.12-0.15 cross-layer redirect; Mamba state tuples
        return list(value)
    shape = getattr(value, "shape", None)
    if shape is None:
        return []
    if len(shape) == 5 and shape[0] == 2:  # FlashAttention per-layer (2, blocks, ...): K and V
        return [value[0], value[1]]
    return [value]


def region_block_counts(kv_caches):
    counts = {}
    for name, value in kv_caches.items():
        for i, region in enumerate(_regions(value)):
            shape = getattr(region, "shape", None)
            if shape is None or not len(shape):
                return {}  # not a tensor layout this check understands (Mamba states)
            counts["%s[%d]" % (name, i)] = int(shape[0])
    return counts


def _assertion_text(err):
    """vLLM's assertion message, or the failing ``assert`` line when it has none."""
    if str(err):
        return str(err)
    frames = traceback.extract_tb(err.__traceback__)
    return "failed: %s" % (frames[-1].line if frames and frames[-1].line else "assertion without a message")


def over_allocated_message(held, budget, f):
    """The refusal of KV tensors holding more blocks than the scheduler's budget (0.29+)."""
    return ("xlkv_autopatch: refusing to register the KV cache with NIXL: the KV tensors are over-allocated, they hold "
            "%d blocks and the scheduler budget (kv_cache_config.num_blocks) is %d (an allocator with virtual "
            "capacity, such as kvcached?). vLLM %d.%d takes per-layer block counts from the KV cache config, so "
            "over-allocated tensors cannot be indexed safely in xlkv's block-outermost layout. Fix: allocate exactly "
            "kv_cache_config.num_blocks blocks, or unset ENABLE_XLKV" % ((held, budget) + f.release[:2]))


def storage_over_allocation(kv_caches):
    """(blocks the storage holds, blocks the view holds) of the first view whose storage holds whole
    blocks (of the view's block stride) beyond the view, or None.  0.29+ reshape the tensors to the
    budget's block count, so an over-allocation shows only in the storage underneath.  Views that
    disagree on their block count are not an over-allocation (one of them is short): None."""
    views = {int(getattr(v, "shape", (None,))[0] or 0) for v in kv_caches.values() if getattr(v, "shape", None)}
    if len(views) > 1:
        return None
    for value in kv_caches.values():
        try:
            stride = value.stride(0) * value.element_size()
            held = (value.untyped_storage().nbytes() - value.storage_offset() * value.element_size()) // stride
            view = int(value.shape[0])
        except (AttributeError, TypeError, IndexError, RuntimeError, ZeroDivisionError):
            continue
        if stride > 0 and held > view:
            return held, view
    return None


def _reconcile(instance, counts, f):
    """0.18+: the worker indexes the scheduler's budget; make it the tensors' real count."""
    expected = getattr(instance, "num_blocks", None)
    ratio = getattr(instance, "_physical_blocks_per_logical_kv_block", 1) or 1
    if ratio > 1 and isinstance(expected, int) and set(counts.values()) == {expected // ratio}:
        # 0.29+ views are indexed in logical blocks, each holding `ratio` kernel blocks
        # (the worker's count is in kernel blocks): the same capacity, nothing to reconcile
        return
    if not (isinstance(expected, int) and expected > 0):
        return
    try:
        real, note = layout.reconcile_block_counts(counts, expected)
    except ValueError as e:
        raise XlkvRegistrationError("xlkv_autopatch: refusing to register the KV cache with NIXL: %s" % e) from e
    if not note:
        return
    if f.mechanism == "layout":
        raise XlkvRegistrationError(over_allocated_message(real, expected, f))
    if real % ratio:
        raise XlkvRegistrationError("xlkv_autopatch: %d kernel blocks are not a whole number of logical blocks "
                                    "(ratio %d)" % (real, ratio))
    instance.num_blocks = real
    if hasattr(instance, "_logical_num_blocks"):
        instance._logical_num_blocks = real // ratio
    info_once("blocks", "%s", note)


def cross_layer_registration(instance, kv_caches, f):
    """Is this call registering xlkv's cross-layer layout?  Decided before vLLM's code runs:
    the 0.12-0.15 redirect marks the worker, 0.29+ workers know their KV layout from
    ``__init__``, and on 0.16-0.28 the model runner registers the one cross-layer tensor
    that this process's connector (patched by xlkv) asked for."""
    if _state.is_cross_layer(instance):
        return True
    if f.mechanism == "layout" or getattr(instance, "_has_mamba", False):
        return False
    return _state.cross_layer_preferred() and not _state.stock_reasons() and len(kv_caches) == 1


def _check_counts(instance, counts, f):
    if len(set(counts.values())) > 1:
        if f.mechanism == "layout" and isinstance(getattr(instance, "region_num_blocks", None), list):
            return  # this release indexes every region by its own block count (region_num_blocks)
        raise XlkvRegistrationError("xlkv_autopatch: refusing to register the KV cache with NIXL: tensors disagree on "
                                    "their block count (%s), and this vLLM indexes every region with one count"
                                    % ", ".join("%s=%d" % kv for kv in sorted(counts.items())[:8]))
    if f.budget_block_count:
        _reconcile(instance, counts, f)


#: register_kv_caches's parameters after self, bound by name
REGISTER_ARGS = ("kv_caches",)


def register_wrapper(wrapped, instance, args, kwargs):
    (kv_caches,) = bind(args, kwargs, *REGISTER_ARGS)
    f = facts.current()
    if isinstance(kv_caches, dict) and cross_layer_registration(instance, kv_caches, f):
        counts = region_block_counts(kv_caches)
        if counts:
            _check_counts(instance, counts, f)
    try:
        result = wrapped(*args, **kwargs)
    except AssertionError as e:
        if f.mechanism == "layout" and _state.is_cross_layer(instance):
            over = storage_over_allocation(kv_caches) if isinstance(kv_caches, dict) else None
            if over is not None:  # the cause of vLLM's failed check, named
                raise XlkvRegistrationError("%s (vLLM's check: %s)" % (over_allocated_message(over[0], over[1], f),
                                                                       _assertion_text(e))) from e
            raise XlkvRegistrationError(
                "xlkv_autopatch: vLLM cannot register this KV cache with NIXL in the block-outermost layout xlkv "
                "asked for (%s). Fix: set VLLM_KV_CACHE_LAYOUT=LBHNC (the stock layout) or unset ENABLE_XLKV"
                % _assertion_text(e)) from e
        raise
    cross = _state.is_cross_layer(instance)
    transfer_order.attach(instance)  # every layout: per-layer regions merge their runs too
    groups = kv_cache_groups(instance)
    info_once("registered", "NIXL registration: %s region(s), %s blocks, %s layout, %s KV cache group(s), block "
              "lengths %s", getattr(instance, "num_regions", None), getattr(instance, "num_blocks", None),
              "cross-layer" if cross else "per-layer (stock)", groups if groups is not None else "?",
              sorted(set(getattr(instance, "block_len_per_layer", []) or []))[:4])
    regions = getattr(instance, "num_regions", None)
    if cross and f.mechanism == "layout" and isinstance(regions, int) and regions > 1:
        # a whole-row layout that vLLM still registered per layer: correct bytes, no gain
        logger.warning("xlkv_autopatch: vLLM registered the block-outermost KV cache as %d NIXL regions (%s KV cache "
                       "group(s)), not one whole-row region: each block still costs %d descriptors. The bytes are "
                       "vLLM's own; set VLLM_KV_CACHE_LAYOUT=LBHNC to keep the stock layout's descriptor merging",
                       regions, groups if groups is not None else "?", regions)
    return result


def kv_cache_groups(worker):
    """How many KV cache groups this worker's engine has (None where the worker does not say)."""
    config = getattr(worker, "kv_cache_config", None) or getattr(worker, "_kv_cache_config", None)
    groups = getattr(config, "kv_cache_groups", None)
    return len(groups) if isinstance(groups, (list, tuple)) else None


#: what this file wraps: the release's NIXL worker class's register_kv_caches, on every release
TARGETS = (
    Target(name="block_count.register_kv_caches", group="nixl", module=NIXL_WORKER_MODULE, owner=NIXL_WORKER_CLASS,
           attr="register_kv_caches", kind="method", wrapper=register_wrapper, params=("self",) + REGISTER_ARGS),
)
