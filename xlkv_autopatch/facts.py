"""The behaviour facts of the installed vLLM release, computed once per process.

The patch wrappers ask :func:`current` instead of comparing version numbers themselves.  The
facts are the columns of the release's row in :mod:`xlkv_autopatch.releases` (which also
derives the patch groups' targets), under the same names: ``current().has_compat_hash`` is the
row's ``has_compat_hash`` column, ``current().mechanism == "layout"`` its ``mechanism``.  This
module only caches them and puts the installed version in ``release``.
Pure Python: no vLLM import (the version comes from package metadata, see
:mod:`xlkv_autopatch.versions`).
"""

import threading
from dataclasses import dataclass, fields
from typing import Optional, Tuple

from . import releases, versions


@dataclass(frozen=True)
class ReleaseFacts(releases.Release):
    """A release table row (:class:`xlkv_autopatch.releases.Release`, every column under its name) for
    one installed vLLM: ``release`` is that vLLM's (major, minor, micro), not the row's "0.12"."""

    release: Tuple[int, int, int]

    def __post_init__(self):
        pass  # the row was checked when the table was parsed; tests replace() single facts


def facts_for(release):
    """The facts for a (major, minor, micro) tuple or a version string: the columns of its row
    in the release table (releases older than the table get its first row, newer ones its last)."""
    rel = versions.release_tuple(release) if not isinstance(release, tuple) else (tuple(release) + (0, 0, 0))[:3]
    row = releases.row_for(rel)
    return ReleaseFacts(**dict({f.name: getattr(row, f.name) for f in fields(row)}, release=rel))


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
