"""What differs between vLLM releases, in one table, computed once per process.

The patch wrappers ask :func:`current` instead of comparing version numbers themselves;
which *targets* exist in a release (module paths, owner classes, signatures) is declared
with the patch groups in :mod:`xlkv_autopatch.patches`.  Pure Python: no vLLM import
(the version comes from package metadata, see :mod:`xlkv_autopatch.versions`).
"""

import threading
from dataclasses import dataclass
from typing import Optional, Tuple

from . import versions

#: Attention backends whose cross-layer layout upstream vLLM supports.
BACKENDS_0_16 = ("FLASH_ATTN", "FLASHINFER")
BACKENDS_0_20 = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")


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


def facts_for(release):
    """The facts for a (major, minor, micro) tuple or a version string."""
    rel = versions.release_tuple(release) if not isinstance(release, tuple) else (tuple(release) + (0, 0, 0))[:3]
    return ReleaseFacts(
        release=rel,
        has_compat_hash=rel >= (0, 13, 0),
        budget_block_count=rel >= (0, 18, 0),
        kv_cache_layouts=rel >= (0, 29, 0),
        fa_heads_outermost=rel < (0, 23, 0) or (0, 26, 0) <= rel < (0, 29, 0),
        cross_layer_backends=BACKENDS_0_20 if rel >= (0, 20, 0) else BACKENDS_0_16,
        failed_recv_looks_up_engine=rel < (0, 22, 0),
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
