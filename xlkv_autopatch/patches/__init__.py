"""The patch sets, one file per vLLM concept they change (see each module's docstring).

Each patch module declares what it wraps beside its wrappers: ``TARGETS``, one
:class:`~xlkv_autopatch.specs.Target` per wrapped attribute (module and class, attribute, kind,
wrapper, the parameters it binds by name, the patch set it joins and the release-table columns
that select it), and ``ATTACHED`` for a wrapper placed on objects at run time (transfer_order.py:
block_count's registration wrapper attaches it to each worker's NIXL agent).  This module only
composes them: :func:`all_groups` turns each set's targets into
:class:`~xlkv_autopatch.specs.PatchGroup` objects per row of the release table
(:mod:`xlkv_autopatch.releases`), consecutive rows whose targets agree forming one group.  The
registry keeps those whose range contains the installed vLLM (and the ``always`` guard); a group
is applied all-or-nothing when its trigger module is imported.  What differs between releases
*inside* a wrapper (hash or not, which layouts keep heads outermost) is in
:mod:`xlkv_autopatch.facts`, from the same table.  The catalogue of every target and its
releases is rendered into docs/mechanism.md by :mod:`xlkv_autopatch.catalogue`.
"""

from dataclasses import dataclass
from typing import Callable, Optional

from .. import releases
from ..specs import PatchGroup
from . import (_kvcached, block_contiguous, block_count, block_size_restage, compat_hash, cross_layer_preference,
               cross_layer_registration, handshake, incremental_detokenizer, kv_cache_layout, kv_connector_factory, model_runner,
               multi_connector, packed_kv_cache_config, page_contiguous, transfer_order)

#: the patch modules, in the order a group lists their targets (a NIXL set: NixlConnector's, the
#: compatibility hash, then the worker's)
MODULES = (kv_cache_layout, page_contiguous, block_contiguous, cross_layer_preference, cross_layer_registration,
           compat_hash, handshake, block_count, packed_kv_cache_config, model_runner, multi_connector,
           kv_connector_factory, transfer_order, incremental_detokenizer, block_size_restage)


@dataclass(frozen=True)
class _Set:
    """How one patch set's targets become groups: the group's name (from its first row), its trigger
    module (from a row), whether it patches NIXL connector code, and its precheck."""

    name: Callable
    trigger: Callable
    nixl: bool = False
    precheck: Optional[Callable] = None
    knob: Optional[str] = None  # a switch's knob: the set is registered only while it is on


#: the patch sets a Target may join (its ``group``), by release row; ``guard`` is registered whatever
#: the release (its range is informational)
SETS = {
    "nixl": _Set(name=lambda row: "%s-%s" % (row.mechanism, row.release), trigger=lambda row: row.home.trigger,
                 nixl=True, precheck=_kvcached.refuse_kvcached),
    "runner": _Set(name=lambda row: "runner-v1", trigger=lambda row: releases.VLLM_CONFIG),
    # 0.24-0.28: the planner's packed multi-group predicate (engine core; not NIXL connector code)
    "packed": _Set(name=lambda row: "packed-%s" % row.release,
                   trigger=lambda row: packed_kv_cache_config.KV_CACHE_UTILS),
    "multi": _Set(name=lambda row: "multi-%s" % row.release, trigger=lambda row: releases.MULTI_CONNECTOR),
    # 0.17+: the API server's first-token detokenizer (XLKV_DETOK_TAIL; not NIXL connector code)
    "detok": _Set(name=lambda row: "detok-%s" % row.release,
                  trigger=lambda row: incremental_detokenizer.DETOKENIZER, knob=incremental_detokenizer.KNOB),
}
GUARD = "guard"

#: patches attached to objects at run time rather than declared as Targets: (file, attribute, what it
#: wraps) -> the PatchSpec name whose wrapper attaches them (so their releases are that spec's)
INSTANCE_PATCHES = {(m.__name__.rsplit(".", 1)[-1], a.attr, a.what): a.by
                    for m in MODULES for a in getattr(m, "ATTACHED", ())}


def targets(group):
    """Every patch module's targets that join the patch set ``group``, in :data:`MODULES` order."""
    found = [t for m in MODULES for t in getattr(m, "TARGETS", ())]
    unknown = sorted({t.group for t in found} - set(SETS) - {GUARD})
    if unknown:
        raise ValueError("patch targets join unknown patch sets %s (known: %s)" % (unknown, sorted(SETS) + [GUARD]))
    return [t for t in found if t.group == group]


def _specs(group, row):
    return tuple(t.spec(row) for t in targets(group) if t.selects(row))


def _runs(group):
    """[[rows]]: runs of consecutive release rows with the same trigger and specs in ``group`` (rows
    without any left out)."""
    def key(row):
        specs = _specs(group, row)
        return (SETS[group].trigger(row), specs) if specs else None

    return releases.runs(key)


def _group(group, rows):
    how, row = SETS[group], rows[0]
    return PatchGroup(name=how.name(row), trigger=how.trigger(row), vllm=releases.span(rows[0], rows[-1]),
                      patches=_specs(group, row), precheck=how.precheck, nixl=how.nixl, knob=how.knob)


def _guard():
    (target,) = targets(GUARD)
    return PatchGroup(name=GUARD, trigger=target.module, vllm=">=0", nixl=False, always=True,
                      patches=(target.spec(None),))


def all_groups():
    """Every patch group, derived from the patch modules' targets and the release table now (a
    changed table changes them).

    The order is the order the hooks are registered in: the cross-layer-block releases' NIXL
    groups, the runner, packed-groups, MultiConnector and detokenizer groups, the KV-cache-layout releases' NIXL
    groups, the guard."""
    nixl = _runs("nixl")
    return ([_group("nixl", rows) for rows in nixl if rows[0].mechanism != "layout"]
            + [_group(group, rows) for group in ("runner", "packed", "multi", "detok") for rows in _runs(group)]
            + [_group("nixl", rows) for rows in nixl if rows[0].mechanism == "layout"]
            + [_guard()])
