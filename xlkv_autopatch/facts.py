"""The behaviour facts of the installed vLLM release, computed once per process.

The patch wrappers ask :func:`current` instead of comparing version numbers themselves.  The
facts are the columns of the release's row in :mod:`xlkv_autopatch.releases` (which also
derives the patch groups' targets); this module names them for the wrappers and caches them.
Pure Python: no vLLM import (the version comes from package metadata, see
:mod:`xlkv_autopatch.versions`).
"""

import threading
from dataclasses import dataclass
from typing import Optional, Tuple

from . import releases, versions


@dataclass(frozen=True)
class ReleaseFacts:
    release: Tuple[int, int, int]
    #: the NIXL handshake compares a compatibility hash (0.13+; 0.12 compares nothing)
    has_compat_hash: bool
    #: the worker registers ``kv_cache_config.num_blocks`` (times the kernel ratio) and
    #: asserts the tensors hold exactly that (0.18+)
    budget_block_count: bool
    #: KV layouts chosen once per engine (``get_required_kvcache_layout``), no
    #: cross-layer-block API (0.29+)
    kv_cache_layouts: bool
    #: a FlashAttention cross-layer block keeps heads outermost, so vLLM's heterogeneous-TP
    #: slicing stays correct (0.12-0.22 and 0.26-0.28; 0.23-0.25 treat FA as blocks-first)
    fa_heads_outermost: bool
    #: backends upstream's cross-layer guard accepts
    cross_layer_backends: Tuple[str, ...]
    #: the worker's ``get_finished`` post-processes a failed receive like a finished one and
    #: looks its remote engine up, which a refused handshake never recorded (0.12-0.21: a
    #: KeyError that ends the worker; 0.22+ skip failed receives)
    failed_recv_looks_up_engine: bool = False
    #: a FlashAttention-style layer's K and V are two NIXL regions in the stock layout
    #: (0.12-0.25; one region per layer from 0.26)
    kv_split_regions: bool = False
    #: vLLM's packed multi-group KV allocation (``kv_cache_utils._use_packed_kv_cache_config``,
    #: enable_cross_layers_blocks with several KV cache groups), registered as one NIXL region (0.24-0.28)
    packed_groups: bool = False
    #: MLA backends whose cross-layer blocks xlkv turns on (0.26-0.28; empty elsewhere)
    mla_cross_layer_backends: Tuple[str, ...] = ()
    #: a KV connector turns vLLM's hybrid KV cache manager off by default, so a sliding-window
    #: hybrid is planned as one KV cache group (0.12-0.21)
    connector_turns_hma_off: bool = False
    #: FastIncrementalDetokenizer primes its DecodeStream with the whole prompt, decoded when the first
    #: token reaches the API server (0.17+): what XLKV_DETOK_TAIL shortens
    detokenizer_primes_prompt: bool = False


def facts_for(release):
    """The facts for a (major, minor, micro) tuple or a version string: the columns of its row
    in the release table (releases older than the table get its first row, newer ones its last)."""
    rel = versions.release_tuple(release) if not isinstance(release, tuple) else (tuple(release) + (0, 0, 0))[:3]
    row = releases.row_for(rel)
    return ReleaseFacts(
        release=rel,
        has_compat_hash=row.hs_hash,
        budget_block_count=row.budget,
        kv_cache_layouts=row.mechanism == "layout",
        fa_heads_outermost=row.fa_heads,
        cross_layer_backends=releases.BACKENDS[row.backends],
        failed_recv_looks_up_engine=row.recv_lookup,
        kv_split_regions=row.kv_split,
        packed_groups=row.packed,
        mla_cross_layer_backends=releases.MLA_BACKENDS[row.mla] if row.mla else (),
        connector_turns_hma_off=row.hma_off,
        detokenizer_primes_prompt=row.prime,
    )


_lock = threading.Lock()
_current: Optional[ReleaseFacts] = None


def current():
    """The installed vLLM's facts, read from package metadata once per process."""
    global _current
    with _lock:
        if _current is None:
            _current = facts_for(versions.vllm_version() or "0")
        return _current


def reset():
    """Forget the cached facts (after XLKV_VLLM_VERSION changed: tests, uninstall)."""
    global _current
    with _lock:
        _current = None
