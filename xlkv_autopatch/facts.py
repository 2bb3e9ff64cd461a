"""The behaviour facts of the installed vLLM release, computed once per process.

The patch wrappers ask :func:`current` instead of comparing version numbers themselves.  The
facts are the columns of the release's row in :mod:`xlkv_autopatch.releases` (which also
derives the patch groups' targets), under the same names: ``current().has_compat_hash`` is the
row's ``has_compat_hash`` column, ``current().mechanism == "layout"`` its ``mechanism``.  This
module only caches them and puts the installed version in ``release``.
Pure Python: no vLLM import (the version comes from package metadata, see
:mod:`xlkv_autopatch.versions`).
"""

import os
import sys
import threading
from dataclasses import dataclass, fields
from typing import Optional, Tuple

from . import releases, versions
from .flag import FLAG, knob_state


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


def release_text(f):
    """The release of facts ``f`` as "0.33"."""
    return "%d.%d" % f.release[:2]


def span_of(predicate):
    """The table's releases where ``predicate(facts)`` holds, as "0.12-0.21" runs."""
    rows = releases.runs(lambda r: predicate(facts_for(r.release)) or None)
    return ", ".join(rs[0].release if len(rs) == 1 else "%s-%s" % (rs[0].release, rs[-1].release) for rs in rows)


#: the module of NVIDIA Dynamo's vLLM worker (``python -m dynamo.vllm``): its frontend detokenizes, so the worker
#: never builds vLLM's incremental detokenizer (seen on 2026-11-29 with ai-dynamo 1.6.1 and vLLM 0.31.0: the
#: XLKV_DETOK_TAIL patch set never applied in either worker)
DYNAMO_WORKER = "dynamo.vllm"
DYNAMO_DETOK = ("it does nothing in NVIDIA Dynamo's vLLM worker (%s): Dynamo's frontend detokenizes, and the worker "
                "never builds vLLM's detokenizer" % DYNAMO_WORKER)


def dynamo_worker_installed():
    """Is NVIDIA Dynamo's vLLM worker installed beside this vLLM?  (Its package is found, not imported.)"""
    import importlib.util

    try:
        spec = importlib.util.find_spec(DYNAMO_WORKER.split(".")[0])
    except (ImportError, ValueError):
        return False
    return bool(spec and spec.submodule_search_locations) and any(
        os.path.isdir(os.path.join(p, DYNAMO_WORKER.split(".")[1])) for p in spec.submodule_search_locations)


def knob_no_effect(name, f, flag_state_, environ=None, modules=None):
    """Why knob ``name``, set on, does nothing on the release of facts ``f`` with the flag as set (None: it
    acts, or it is not on).  ``modules``: the modules loaded in the asking process (default ``sys.modules``), where
    NVIDIA Dynamo's worker shows.  ``status`` prints it beside the knob, and start-up and each vLLM module patched
    log it (registry.warn_inert_knobs): the run and status say the same."""
    from . import layout

    if knob_state(name, environ) != "on" or name == FLAG:
        return None
    if name == layout.EQUAL_TP_KNOB and f.mechanism == "layout":
        return ("it does nothing on vLLM %s: xlkv's heads-outermost %s rows serve any TP pairing (it acts on vLLM "
                "%s only)" % (release_text(f), layout.HEADS_OUTERMOST_LAYOUT,
                              span_of(lambda x: x.mechanism != "layout")))
    if name in ("XLKV_DETOK_TAIL",):
        if not f.detokenizer_primes_prompt:
            return ("it does nothing on vLLM %s: its detokenizer primes no prompt (it acts on vLLM %s)"
                    % (release_text(f), span_of(lambda x: x.detokenizer_primes_prompt)))
        if DYNAMO_WORKER in (sys.modules if modules is None else modules):
            return DYNAMO_DETOK
    if flag_state_ != "on" and ((os.environ if environ is None else environ).get(name) or "").strip():
        return "it does nothing while ENABLE_XLKV is not on (the shim is not active)"
    return None
