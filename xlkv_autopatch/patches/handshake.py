"""NIXL handshake: refuse layouts that would move wrong bytes, and say why.

Why
    A handshake between a cross-layer side and a per-layer side must fail with a message
    that names the cause; so must configurations the cross-layer layout cannot serve
    correctly: a different block size on prefill and decode (served on 0.29+ where decode
    blocks hold a whole number of prefill blocks and block_size_restage.py restages the
    received heads-outermost rows, layout.block_sizes_served; vLLM itself refuses the other
    direction) and heterogeneous TP where a block cannot be sliced by heads (blocks-first
    backends, vLLM >= 0.29 token-major BLNHC rows and heads-outermost rows whose heads do
    not tile the row, 0.24-0.28's packed multi-group layout that
    packed_kv_cache_config.py turns on).
How
    ``_nixl_handshake`` is wrapped: vLLM's "NIXL compatibility hash mismatch" error is
    re-raised as XlkvMismatchError naming what each side runs (from the hashes
    compat_hash.py remembered in _state.py), the cause this engine recorded when it kept
    the stock layout (an explicit VLLM_KV_CACHE_LAYOUT, a fallback), the causes possible
    on the remote side, and the fix: only one that works for that cause (an explicit
    VLLM_KV_CACHE_LAYOUT is named, not the flag, where both sides have the flag; a smaller attention
    kernel block asks for --block-size equal to it, since stock vLLM does not serve that either).  ``add_remote_agent`` (where a peer's
    metadata is first used; vLLM's own block-size and TP arithmetic runs inside it) is
    wrapped to check block size and TP slicing before any of that runs (only where this
    worker registered xlkv's cross-layer layout; a block-size refusal tells a different
    ``--block-size`` from a different attention kernel block), and to compare the layouts
    both sides registered (region counts up to 0.28; from 0.29 the published KV-cache layout
    name, and for the same whole-row layout the region counts: one row per block here, one
    region per layer there): that is what refuses a one-sided flag on 0.12, which has no hash,
    and where the hash check is off (``enforce_handshake_compat: false``), before vLLM's own
    block-length assertions.  On 0.29+ heterogeneous TP with heads-outermost rows
    (page_contiguous.py checked them) goes on inside ``_state.head_slicing()``, where
    block_contiguous.py lets vLLM's own head-slicing gate through.  ``get_finished`` (0.12-0.21) completes the
    receives whose handshake failed without vLLM's post-processing, which looked up the
    refused remote engine (KeyError: the decode worker died); 0.22+ skip failed receives
    themselves.  Release differences (hash or not, which layouts keep heads outermost,
    the failure path) come from facts.py.
vLLM versions
    ``_nixl_handshake`` 0.13+; ``add_remote_agent`` 0.12+ (owner:
    NixlConnectorWorker up to 0.23, NixlBaseConnectorWorker from 0.24); ``get_finished``
    0.12-0.23 (acting on 0.12-0.21).
Removal
    When the layout is part of upstream's handshake checks for every supported release.
"""

import os
import re

from .. import facts, layout
from ..errors import XlkvMismatchError
from ..logs import logger
from ..specs import NIXL_WORKER_CLASS, NIXL_WORKER_MODULE, Target
from . import _state
from ._args import bind
from ._config import NIXL_CONNECTORS

#: this side runs the shim (the handshake wrappers exist only with ENABLE_XLKV on), so its stock
#: layout is always a fallback with a cause
LOCAL_PER_LAYER = "the stock per-layer KV layout (ENABLE_XLKV is set here, but xlkv kept the stock layout)"

LOCAL_FIX = ("Fix: remove the cause named above on this engine, so that both engines run xlkv's layout, or unset "
             "ENABLE_XLKV on the remote engine, so that both run the stock layout")


def _local_fix():
    """The fix where this engine kept the stock layout and the remote runs xlkv's: by this engine's cause, only
    fixes that work.  A smaller attention kernel block (0.29+): the stock layout on both sides does not serve
    it either (vLLM asserts on the kernel block sizes), so the KV block must be the kernel block on both; an
    explicit VLLM_KV_CACHE_LAYOUT: the stock layout on the remote differs from it (unless it names vLLM's default
    LBHNC), so the variable must go."""
    reasons = _state.stock_reasons()
    split = next((layout.kernel_split_of(r) for r in reasons if layout.kernel_split_of(r)), None)
    if split:
        return ("Fix: set --block-size %d (the attention kernel block) on both engines, so that both run xlkv's "
                "layout (the stock layout on both does not serve %d-token kernel blocks facing %d-token blocks "
                "either)" % (split[0], split[0], split[1]))
    env = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    if facts.current().mechanism == "layout" and env and env not in layout.WHOLE_ROW_LAYOUTS:
        return ("Fix: unset VLLM_KV_CACHE_LAYOUT on this engine, so that both engines run xlkv's layout%s"
                % (", or unset ENABLE_XLKV on the remote engine, so that both run the stock layout"
                   if layout.layout_name(env) == "LBHNC" else ""))
    return LOCAL_FIX

OTHER_CONFIGURATION = (
    "xlkv's cross-layer KV layout for another configuration: vLLM's compatibility hash also covers the model, dtype, "
    "KV cache dtype, attention backend, vLLM release and, on recent releases, whether the hybrid KV cache manager is "
    "on, which vLLM turns off for a MultiConnector whose other connector does not support it")
OTHER_FIX = ("Fix: run the same model, dtype, attention backend, vLLM release and KV connector list (a MultiConnector "
             "with the same connectors, or a plain NixlConnector) on both sides")

#: 0.29+: vLLM hashes no KV layout, so a peer without xlkv publishes the same hash whatever its layout.  This
#: engine runs xlkv's token-major BLNHC rows (MLA, or an explicit VLLM_KV_CACHE_LAYOUT=BLNHC here): the remote's
#: explicit BLNHC gives it the same rows once the flag is on there
REMOTE_UNTAGGED_FIX = ("Fix: set ENABLE_XLKV=true on the remote engine as well (an explicit VLLM_KV_CACHE_LAYOUT=%s "
                       "there may stay), or unset it on both" % layout.BLOCK_OUTERMOST_LAYOUT)


def _remote_untagged_fix(ours, hetero_tp):
    """The fix where the remote publishes no xlkv tag (0.29+).  This engine's BHLNC rows: the flag there gives
    the remote the same rows only without an explicit VLLM_KV_CACHE_LAYOUT (any other value wins over xlkv);
    both sides without the flag run the stock layout, which vLLM serves at different TP sizes only where
    neither sets VLLM_KV_CACHE_LAYOUT=BLNHC (it refuses to slice those rows by heads)."""
    if ours != _state.XLKV_HEADS:
        return REMOTE_UNTAGGED_FIX
    return ("Fix: set ENABLE_XLKV=true on the remote engine as well, and remove there the cause its log names "
            "(VLLM_KV_CACHE_LAYOUT: unset it, or set %s, since any other value wins over xlkv; a smaller attention "
            "kernel block: --block-size equal to it on both engines), or unset ENABLE_XLKV on both%s"
            % (layout.HEADS_OUTERMOST_LAYOUT, " (vLLM then serves this TP pairing only with the same attention "
               "kernel block on both and without VLLM_KV_CACHE_LAYOUT=%s on either side)"
               % layout.BLOCK_OUTERMOST_LAYOUT if hetero_tp else ""))

FIX = ("Fix: set ENABLE_XLKV=true on BOTH prefill and decode (or unset it on both), with the same "
       "xlkv_autopatch, vLLM release and connector configuration (a MultiConnector on one side only "
       "can turn cross-layer blocks off there)")

REMOTE_STOCK_CAUSES = (
    "On the remote engine either ENABLE_XLKV is unset, or it is set and that engine kept the stock layout: its log "
    "has an xlkv WARNING or INFO line naming why (an explicit VLLM_KV_CACHE_LAYOUT, which wins over xlkv on vLLM "
    "0.29+; a MultiConnector with a connector that takes no cross-layer blocks; MLA or hybrid models; host-buffer "
    "mode; a smaller attention kernel block; on vLLM 0.12-0.28 cross-layer blocks that cannot be sliced by KV heads "
    "without %s=true, which this engine may have set)" % layout.EQUAL_TP_KNOB)


#: 0.29+: xlkv's own tag without a registration suffix is its token-major BLNHC rows, which xlkv requests for MLA
#: only; a model whose KV heads are split over ranks runs them where VLLM_KV_CACHE_LAYOUT=BLNHC is set explicitly
TOKEN_MAJOR = ("xlkv's token-major %s block rows (ENABLE_XLKV=true; for a model whose KV heads are split over ranks "
               "that means an explicit VLLM_KV_CACHE_LAYOUT=%s, since xlkv itself requests %s)"
               % (layout.BLOCK_OUTERMOST_LAYOUT, layout.BLOCK_OUTERMOST_LAYOUT, layout.HEADS_OUTERMOST_LAYOUT))


def _token_major_vs_heads(ours, theirs):
    """0.29+, both sides xlkv on the same model, one with token-major BLNHC rows (an explicit
    VLLM_KV_CACHE_LAYOUT=BLNHC: xlkv requests BHLNC rows for this model), the other with BHLNC rows.  Both
    flags are on: the layout variable is the cause, and unsetting it where it is set is the fix."""
    if ours == _state.XLKV:
        env = os.environ.get("VLLM_KV_CACHE_LAYOUT")
        return (TOKEN_MAJOR + ("; here: %s" % layout.explicit_layout_reason(env) if env else ""), theirs,
                "Fix: unset VLLM_KV_CACHE_LAYOUT on this engine, so that both run xlkv's %s rows (they serve any "
                "TP pairing)" % layout.HEADS_OUTERMOST_LAYOUT)
    return (ours, TOKEN_MAJOR,
            "Fix: unset VLLM_KV_CACHE_LAYOUT on the remote engine, so that both run xlkv's %s rows (they serve any "
            "TP pairing)" % layout.HEADS_OUTERMOST_LAYOUT)


def _hash_in(text, label):
    m = re.search(label + r":\s*(\S+)", text)
    return m.group(1).rstrip(".,") if m else None


def _local_cause():
    reasons = _state.stock_reasons()
    env_layout = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    if facts.current().mechanism == "layout" and env_layout and env_layout not in layout.WHOLE_ROW_LAYOUTS:
        # vLLM does not ask the connector for a layout then, so no patch saw it: name it here
        explicit = layout.explicit_layout_reason(env_layout)
        # a fallback's reason starts with the same words where the registration noted it: named once
        reasons = reasons if any(explicit in r for r in reasons) else reasons + [explicit]
    return ("; here: %s" % "; ".join(reasons)) if reasons else ""


def _connectors_here(worker):
    """What this engine's connector configuration adds to its hash: the MultiConnector's other
    connectors where the worker sees them, and whether vLLM's hybrid KV cache manager is on
    (vLLM hashes that; it turns it off for a MultiConnector with a connector that lacks it, and
    hands each child connector a config of its own, so the worker may not see the list)."""
    vllm_config = getattr(worker, "vllm_config", None)
    notes = []
    cfg = getattr(vllm_config, "kv_transfer_config", None)
    if getattr(cfg, "kv_connector", None) == "MultiConnector":
        children = (getattr(cfg, "kv_connector_extra_config", None) or {}).get("connectors") or []
        others = sorted({str(c.get("kv_connector")) for c in children if isinstance(c, dict)} - set(NIXL_CONNECTORS))
        if others:
            notes.append("this engine runs its NixlConnector inside a MultiConnector with %s" % ", ".join(others))
    hma_off = getattr(getattr(vllm_config, "scheduler_config", None), "disable_hybrid_kv_cache_manager", None)
    if isinstance(hma_off, bool):
        notes.append("vLLM's hybrid KV cache manager is %s on this engine" % ("off" if hma_off else "on"))
    return "".join("; " + n for n in notes)


def _explain(local, remote, worker=None, remote_tp=None):
    """(what this engine runs, what the remote runs, the fix) or None when xlkv cannot tell (``remote_tp``: the
    peer's TP size where the handshake knows it)."""
    ours, theirs = _state.describe_hash(local), _state.describe_hash(remote)
    tagged = {layout.tag_hash(local): _state.XLKV, layout.tag_hash(local, layout.ROW_AT_ONE_KV_HEAD): _state.XLKV_ROW,
              layout.tag_hash(local, layout.HEADS_OUTERMOST_ROWS): _state.XLKV_HEADS} if local else {}
    if theirs is None and remote in tagged:
        # the peer is this very configuration with xlkv's layout; this side kept the stock one
        ours = LOCAL_PER_LAYER
        theirs = tagged[remote]
    if theirs is None:
        if remote and remote.startswith(layout.HASH_PREFIX):
            here = ours if _state.is_xlkv(ours) else LOCAL_PER_LAYER + _local_cause()
            return here + _connectors_here(worker), OTHER_CONFIGURATION, OTHER_FIX
        return None
    ours = ours or "a configuration xlkv does not recognise"
    if facts.current().mechanism == "layout" and {ours, theirs} == {_state.XLKV, _state.XLKV_HEADS}:
        return _token_major_vs_heads(ours, theirs)
    if _state.is_untagged(ours) or ours == LOCAL_PER_LAYER:
        return LOCAL_PER_LAYER + _local_cause(), theirs, _local_fix()
    if theirs == _state.UNTAGGED_0_29:
        hetero = isinstance(remote_tp, int) and worker is not None and remote_tp != _local_tp(worker)
        return ours, theirs + ". " + REMOTE_STOCK_CAUSES, _remote_untagged_fix(ours, hetero)
    if theirs in (_state.PER_LAYER, _state.UNTAGGED_PACKED):
        return ours, theirs + ". " + REMOTE_STOCK_CAUSES, FIX
    return ours, theirs, FIX


#: _nixl_handshake's parameters after self that handshake_wrapper binds by name
HANDSHAKE_ARGS = ("host", "port", "remote_tp_size")


def handshake_wrapper(wrapped, instance, args, kwargs):
    try:
        return wrapped(*args, **kwargs)
    except RuntimeError as err:
        text = str(err)
        if "compatibility hash mismatch" not in text:
            raise
        (remote_tp,) = bind(args, kwargs, *HANDSHAKE_ARGS)[2:]
        explained = _explain(getattr(instance, "compat_hash", None) or _hash_in(text, "Local"), _hash_in(text, "Remote"),
                             instance, remote_tp)
        if explained is None:
            raise  # not a layout difference xlkv can name: keep vLLM's message
        ours, theirs, fix = explained
        raise XlkvMismatchError(
            "xlkv_autopatch: NIXL handshake refused: this %s engine runs %s; the remote engine runs %s. %s"
            % (_role(instance), ours, theirs, fix)) from err


def finished_wrapper(wrapped, instance, args, kwargs):
    """0.12-0.21: complete the receives that failed (a refused or broken handshake) without vLLM's
    post-processing of received blocks, which looks up the remote engine a refused handshake
    never recorded (KeyError: the worker dies); 0.22+ skip failed receives themselves."""
    pending = getattr(instance, "_failed_recv_reqs", None)
    metadata = getattr(instance, "_recving_metadata", None)
    if not pending or not isinstance(metadata, dict) or not facts.current().failed_recv_looks_up_engine:
        return wrapped(*args, **kwargs)
    failed = set(pending)
    pending.difference_update(failed)
    for req_id in failed:
        metadata.pop(req_id, None)  # what vLLM does for every finished receive; no KV to post-process
    done_sending, done_recving = wrapped(*args, **kwargs)
    logger.info("xlkv_autopatch: request(s) %s: the KV receive failed (vLLM logged why); reported finished with "
                "their blocks invalid (vLLM 0.22+ do the same), and this worker keeps serving", sorted(failed))
    return done_sending, set(done_recving) | failed


def _role(worker):
    cfg = getattr(worker, "kv_transfer_config", None) or getattr(getattr(worker, "vllm_config", None),
                                                                "kv_transfer_config", None)
    return getattr(cfg, "kv_role", "local") or "local"


def _local_tp(worker):
    for name in ("world_size", "tp_size"):
        value = getattr(worker, name, None)
        if isinstance(value, int):
            return value
    return 1


def _logical_block_size(worker):
    cfg = getattr(getattr(worker, "vllm_config", None), "cache_config", None)
    value = getattr(cfg, "block_size", None)
    return value if isinstance(value, int) else None


def _block_sizes_served(instance, f, local_bs, remote_bs, local_tp, remote_tp):
    """None where this worker reads a peer whose blocks hold other token counts, else why not:
    layout.block_sizes_served (which ``status --prefill-block-size`` asks too) with what this worker
    knows: MLA, its KV cache groups, its heads-outermost rows (page_contiguous.py) and whether the
    receive restage (block_size_restage.py) marked it."""
    sliceable, why_not = _state.heads_outermost(instance)
    decision, _descriptors = layout.block_sizes_served(
        f, local_block_size=local_bs, remote_block_size=remote_bs, local_tp=local_tp, remote_tp=remote_tp,
        mla=bool(getattr(instance, "use_mla", False)), sliding_window=bool(_sliding_window_groups(instance)),
        heads_outermost_rows=sliceable or bool(why_not), rows_why_not=why_not, restaged=_state.restages(instance))
    return None if decision.use else decision.reason


def _sliding_window_groups(instance):
    """The KV cache groups of this worker's engine that keep a sliding window (vLLM's NIXL scheduler
    sends only their in-window tail)."""
    config = getattr(instance, "kv_cache_config", None)
    return [g for g in getattr(config, "kv_cache_groups", None) or ()
            if getattr(getattr(g, "kv_cache_spec", None), "sliding_window", None)]


def _block_size_refusal(meta, local_bs, remote_bs, logical, why, f):
    engine = getattr(meta, "engine_id", "?")
    if logical is not None and logical != local_bs:
        here = "KV blocks of %d tokens (--block-size), split by the attention kernel into %d-token blocks" % (
            logical, local_bs)
    else:
        here = "%d-token KV blocks" % local_bs
    # the fix by cause: a multiple helps only where the direction is the refused part on a release that serves it
    multiple = ("decode blocks a multiple of prefill blocks, " if f.mechanism == "layout" and local_bs % remote_bs
                else "")
    return XlkvMismatchError(
        "xlkv_autopatch: NIXL handshake refused: the remote engine %s registers %s-token blocks with NIXL, this engine "
        "%s: %s. Where --block-size is the same on both sides, the attention kernel block differs: a different "
        "attention backend (or kernel block size) on one side. Fix: %sthe same --block-size and the same attention "
        "backend on prefill and decode, or unset ENABLE_XLKV on both" % (engine, remote_bs, here, why, multiple))


def _layout_refusal(instance, meta, cross, f):
    """The two sides registered different layouts (one cross-layer, one per-layer).  vLLM's
    compatibility hash catches that first where it is enforced; 0.12 has no hash, and with
    ``enforce_handshake_compat: false`` vLLM would go on to its own block-length assertions."""
    remote_regions = len(getattr(meta, "kv_caches_base_addr", []) or [])
    local_regions = len(getattr(instance, "block_len_per_layer", []) or [])
    names = (getattr(instance, "kv_cache_layout", None), getattr(meta, "kv_cache_layout", None))
    if f.mechanism == "layout" and not all(isinstance(n, str) and n for n in names):
        return None  # 0.29+: only the published layout names tell; region counts differ for other reasons (PP)
    if f.mechanism != "layout" and (getattr(instance, "pp_size", 1) or 1) != 1:
        return None  # pipeline parallel: vLLM slices the peer's regions to this stage's layers
    remote_cross = layout.remote_cross_layer(
        local_cross=cross, local_regions=local_regions, remote_regions=remote_regions,
        **(dict(local_layout=names[0], remote_layout=names[1]) if f.mechanism == "layout" else {}))
    if remote_cross is None and f.mechanism == "layout" and cross and local_regions == 1 and remote_regions > 1:
        # the same whole-row layout name, registered as one region per layer there (a layer's page is
        # contiguous at one KV head per rank; only xlkv has vLLM register the row whole then)
        remote_cross = False
    if remote_cross is None:
        return None
    regions = ("this engine registered %d region(s) (KV layout %s), the remote engine %d (KV layout %s)"
               % (local_regions, names[0], remote_regions, names[1]) if f.mechanism == "layout" else
               "this engine registered %d region(s), the remote engine %d" % (local_regions, remote_regions))
    if not f.has_compat_hash:
        why = "vLLM %s compares no compatibility hash" % ".".join(map(str, f.release[:2]))
    elif getattr(instance, "enforce_compat_hash", True) is False:
        why = "vLLM's compatibility-hash check is off here (enforce_handshake_compat: false)"
    else:
        why = "the compatibility hashes matched"
    if cross:
        return XlkvMismatchError(
            "xlkv_autopatch: NIXL handshake refused: this engine runs %s; the remote engine runs %s (%s; %s, so xlkv "
            "compared the registered layouts). %s" % (_state.XLKV, _state.PER_LAYER, regions, why, FIX))
    return XlkvMismatchError(
        "xlkv_autopatch: NIXL handshake refused: this engine runs %s%s; the remote engine runs xlkv's cross-layer KV "
        "layout, or another model (%s; %s, so xlkv compared the registered layouts). %s"
        % (LOCAL_PER_LAYER, _local_cause(), regions, why, _local_fix()))


#: add_remote_agent's parameters after self that validate_wrapper binds by name (0.33 appends
#: remote_dcp_size: more may follow)
VALIDATE_ARGS = ("nixl_agent_meta", "remote_tp_rank", "remote_tp_size")


def validate_wrapper(wrapped, instance, args, kwargs):
    meta, _rank, remote_tp = bind(args, kwargs, *VALIDATE_ARGS)
    remote_tp = 1 if remote_tp is None else remote_tp  # the signature's default
    f = facts.current()
    cross = _state.is_cross_layer(instance)
    slicing = False
    if cross:
        local_bs = getattr(instance, "block_size", None)
        remote_bs = getattr(meta, "block_size", None)
        local_tp = _local_tp(instance)
        if local_bs is not None and remote_bs is not None and local_bs != remote_bs:
            why = _block_sizes_served(instance, f, local_bs, remote_bs, local_tp, remote_tp)
            if why is not None:
                raise _block_size_refusal(meta, local_bs, remote_bs, _logical_block_size(instance), why, f)
        if remote_tp and remote_tp != local_tp:
            decision, slicing = _hetero_tp(instance, f, local_tp, remote_tp)
            if not decision.use:
                fix = _hetero_tp_fix(instance, f)
                raise XlkvMismatchError(
                    "xlkv_autopatch: NIXL handshake refused: prefill TP %s, decode TP %s: %s. %s" % (
                        remote_tp, local_tp, decision.reason, fix))
    refusal = _layout_refusal(instance, meta, cross, f)
    if refusal is not None:
        raise refusal
    if slicing:
        with _state.head_slicing():  # block_contiguous.py: vLLM's gate lets these rows through
            return wrapped(*args, **kwargs)
    return wrapped(*args, **kwargs)


def _hetero_tp_fix(instance, f):
    """The fix of a heterogeneous-TP refusal, by what made this engine's cross-layer blocks unsliceable."""
    if f.mechanism != "layout":
        return ("Fix: unset %s on both engines (xlkv then keeps the stock layout wherever its cross-layer blocks "
                "cannot be sliced by KV heads, and any TP pairing is served), or use the same tensor-parallel size "
                "on both" % layout.EQUAL_TP_KNOB)
    env = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    if env and layout.layout_name(env) == layout.BLOCK_OUTERMOST_LAYOUT:
        # vLLM's own BLNHC rows are refused at heterogeneous TP with or without xlkv: the variable is the cause
        return ("Fix: unset VLLM_KV_CACHE_LAYOUT on both engines (%s, which wins over xlkv, gives token-major rows; "
                "without it xlkv's %s rows serve any TP pairing), or use the same tensor-parallel size on both"
                % (layout.explicit_layout_reason(env), layout.HEADS_OUTERMOST_LAYOUT))
    return "Fix: use the same tensor-parallel size on both, or unset ENABLE_XLKV on both"


def _hetero_tp(instance, f, local_tp, remote_tp):
    """(can this cross-layer worker read a peer at ``remote_tp`` (layout.pair_served, which status asks
    too), does vLLM slice heads-outermost rows for it: the gate's scope is needed)."""
    replicated = bool(getattr(instance, "use_mla", False))  # MLA's latent cache: one remote rank, nothing sliced
    sliceable, why_not = _state.heads_outermost(instance) if f.mechanism == "layout" else (False, None)
    decision = layout.pair_served(f, local_tp=local_tp, remote_tp=remote_tp, replicated=replicated,
                                  backend=getattr(instance, "backend_name", ""), heads_outermost_rows=sliceable,
                                  packed_groups=f.mechanism != "layout" and _state.is_packed_groups(instance))
    if f.mechanism == "layout" and why_not:
        decision = layout.Decision(False, "this engine's %s rows cannot be sliced by heads: %s"
                                   % (layout.HEADS_OUTERMOST_LAYOUT, why_not))
    return decision, f.mechanism == "layout" and decision.use and sliceable


#: what this file wraps, on the release's NIXL worker class (NixlConnectorWorker up to 0.23,
#: NixlBaseConnectorWorker from 0.24): add_remote_agent everywhere, get_finished where the worker has
#: the one the shim wraps (the release table's ``finished``; it acts where ``failed_recv_looks_up_engine``),
#: _nixl_handshake where it compares a compatibility hash (``has_compat_hash``)
TARGETS = (
    Target(name="handshake.validate", group="nixl", module=NIXL_WORKER_MODULE, owner=NIXL_WORKER_CLASS,
           attr="add_remote_agent", kind="method", wrapper=validate_wrapper,
           params=("self",) + VALIDATE_ARGS + ("...",)),
    Target(name="handshake.failed_recv", group="nixl", module=NIXL_WORKER_MODULE, owner=NIXL_WORKER_CLASS,
           attr="get_finished", kind="method", wrapper=finished_wrapper, params=("self",), when={"finished": True}),
    Target(name="handshake.explain_mismatch", group="nixl", module=NIXL_WORKER_MODULE, owner=NIXL_WORKER_CLASS,
           attr="_nixl_handshake", kind="method", wrapper=handshake_wrapper,
           params=("self",) + HANDSHAKE_ARGS + ("...",), when={"has_compat_hash": True}),
)
