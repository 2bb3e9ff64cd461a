"""Patch registry: declarative patch specs, post-import hooks, exact undo.

A :class:`PatchSpec` names one attribute of vLLM to wrap: the module and class that
expose it, the attribute, its kind (method / classmethod / property / function /
attribute), the vLLM versions it is for and the parameters its target must have.
Specs that belong together form a :class:`PatchGroup`, applied all-or-nothing when its
trigger module is imported (wrapt post-import hook: nothing is imported early).

The wrapper is placed on the class that *defines* the attribute (found through the MRO),
so aliases (``NixlConnector = NixlPullConnector``) and siblings (pull/push) all see it.
Applying twice (``.pth`` + plugin, fork) leaves one wrapper.  :meth:`Registry.uninstall`
restores ``vars(owner)`` exactly.
"""

import importlib
import inspect
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import List, Optional

import wrapt

from . import facts, releases, versions
from .errors import XlkvError, XlkvGuardError, XlkvUnsupportedVersion
from .flag import knob_state
from .logs import logger, once
from .specs import PatchSpec


def fix(supported=None):
    """The way out of a refusal: "install a vLLM release in <supported>" (default: the release
    table's range), or, when XLKV_VLLM_VERSION names another release than the installed one,
    the override, both versions and "unset it" (:func:`versions.fix`)."""
    return versions.fix(supported or releases.supported_range())


# --------------------------------------------------------------------------- wrappers


class XlkvFunctionWrapper(wrapt.FunctionWrapper):
    """Marker type: a wrapper this package installed."""


class XlkvProperty(property):
    """Marker type: a property rebuilt around a wrapped getter."""


class XlkvAttribute:
    """Descriptor replacing a plain class attribute; computed on class and instance access."""

    def __init__(self, original, compute, name):
        self.original = original
        self._compute = compute
        self.__name__ = name

    def __get__(self, instance, owner=None):
        return self._compute(self.original, instance, owner if owner is not None else type(instance))

    def __repr__(self):
        return "<xlkv attribute %s over %r>" % (self.__name__, self.original)


OURS = (XlkvFunctionWrapper, XlkvProperty, XlkvAttribute)


@dataclass
class Resolved:
    spec: PatchSpec
    holder: object  # class or module that receives the wrapper
    original: object  # raw value from vars(holder) (or the inherited value)
    had_own: bool  # holder defined the attribute itself
    already: bool  # an xlkv wrapper is already there (fork, double trigger)


@dataclass
class Record:
    spec: PatchSpec
    holder: object
    original: object
    had_own: bool
    wrapper: object


def describe(obj):
    """"module" for a module, "module.QualName" for a class: where a wrapper sits."""
    if inspect.ismodule(obj):
        return obj.__name__
    return "%s.%s" % (getattr(obj, "__module__", "?"), getattr(obj, "__qualname__", getattr(obj, "__name__", "?")))


def _function_of(raw, kind):
    if kind == "classmethod" or isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    if kind == "property":
        return raw.fget
    return raw


def resolve(spec):
    """Find where ``spec`` lands and check the target's shape; raise XlkvGuardError."""
    module = sys.modules.get(spec.module)
    if module is None:
        try:
            module = importlib.import_module(spec.module)
        except ImportError as e:
            raise XlkvGuardError("%s: module %s cannot be imported (%s)" % (spec.name, spec.module, e)) from e
    if spec.owner is None:
        holder = module
        if spec.attr not in vars(module):
            raise XlkvGuardError("%s: %s has no attribute %s" % (spec.name, spec.module, spec.attr))
        raw = vars(module)[spec.attr]
        had_own = True
    else:
        named = getattr(module, spec.owner, None)
        if not inspect.isclass(named):
            raise XlkvGuardError("%s: %s has no class %s" % (spec.name, spec.module, spec.owner))
        definer = next((k for k in named.__mro__ if spec.attr in vars(k)), None)
        if definer is None:
            raise XlkvGuardError("%s: %s.%s does not exist" % (spec.name, spec.owner, spec.attr))
        raw = vars(definer)[spec.attr]
        if spec.on_named_class:
            holder, had_own = named, definer is named
        else:
            holder, had_own = definer, True
    already = isinstance(vars(holder).get(spec.attr), OURS)
    if already:
        return Resolved(spec, holder, None, had_own, True)
    _check_kind(spec, raw)
    if spec.params is not None:
        try:
            got = tuple(inspect.signature(_function_of(raw, spec.kind)).parameters)
        except (TypeError, ValueError) as e:
            raise XlkvGuardError("%s: cannot read the signature of %s (%s)" % (spec.name, spec.target, e)) from e
        want = tuple(spec.params)
        if want and want[-1] == "...":
            want, got = want[:-1], got[:len(want) - 1]
        if got != want:
            raise XlkvGuardError(
                "%s: %s has parameters %s, the patch expects %s" % (spec.name, spec.target, got, tuple(spec.params))
            )
    return Resolved(spec, holder, raw, had_own, False)


def _check_kind(spec, raw):
    kind = spec.kind
    ok = {
        "classmethod": isinstance(raw, classmethod),
        "property": isinstance(raw, property),
        "method": inspect.isfunction(raw),
        "function": inspect.isfunction(raw),
        "attribute": not (callable(raw) or isinstance(raw, (property, classmethod, staticmethod))),
    }[kind]
    if not ok:
        raise XlkvGuardError(
            "%s: %s is a %s, the patch expects a %s" % (spec.name, spec.target, type(raw).__name__, kind)
        )


# --------------------------------------------------------------------------- registry


@dataclass
class _State:
    installed: bool = False
    active: bool = False
    sources: List[str] = field(default_factory=list)
    version: Optional[str] = None
    records: List[Record] = field(default_factory=list)
    applied_groups: List[str] = field(default_factory=list)
    first_calls: set = field(default_factory=set)
    refusal: Optional[str] = None  # the unsupported-release message, repeated at every NIXL connector
    #: group name -> the error that stopped it (its type, its message), repeated by the connector guard
    group_refusals: dict = field(default_factory=dict)


class Registry:
    """``groups_provider``: a callable returning the PatchGroups (``patches.all_groups``);
    given here or to :meth:`install`, so this module never imports the patches.  ``supported``:
    a PEP 440 range, None for the release table's."""

    def __init__(self, groups_provider=None, supported=None, version_provider=versions.vllm_version):
        self._groups_provider = groups_provider
        self._supported = supported
        self._version_provider = version_provider
        self._lock = threading.RLock()
        self.state = _State()

    @property
    def supported(self):
        """The vLLM releases this registry accepts: the one given, else the release table's
        range (:func:`releases.supported_range`, read at every call)."""
        return self._supported or releases.supported_range()

    # -- selection -------------------------------------------------------------
    def groups(self):
        return list(self._groups_provider()) if self._groups_provider is not None else []

    def groups_for(self, version):
        """The groups for ``version``: those whose range contains it, and the ``always`` ones."""
        return [g for g in self.groups() if g.always or versions.in_range(version, g.vllm)]

    def check_version(self, version):
        """Raise XlkvUnsupportedVersion unless ``version`` is covered."""
        if versions.parse(version) is None:
            raise XlkvUnsupportedVersion(
                "xlkv_autopatch: ENABLE_XLKV is set but %r is not a vLLM version number%s; %s"
                % (version, " (it comes from %s)" % versions.OVERRIDE if versions.override_value() == version else "",
                   fix(self.supported)))
        if not versions.in_range(version, self.supported):
            raise XlkvUnsupportedVersion(
                "xlkv_autopatch: ENABLE_XLKV is set but vLLM %s is not supported (supported: %s); %s"
                % (version, self.supported, fix(self.supported))
            )
        if not any(g.nixl for g in self.groups_for(version)):
            parsed = versions.parse(version)
            dev = ("; %s is a development build, whose code lies between two releases: set %s to the release whose "
                   "code it carries" % (version, versions.OVERRIDE)) if parsed is not None and parsed.is_devrelease else ""
            raise XlkvUnsupportedVersion(
                "xlkv_autopatch: ENABLE_XLKV is set but no patch set covers vLLM %s%s; %s"
                % (version, dev, fix(self.supported))
            )

    # -- install ---------------------------------------------------------------
    def install(self, source="api", groups_provider=None):
        with self._lock:
            st = self.state
            if groups_provider is not None:
                self._groups_provider = groups_provider
            if source not in st.sources:
                st.sources.append(source)
            if st.installed:
                return False
            st.installed = True
            st.active = True
            facts.reset()
            version = self._version_provider()
            st.version = version
            if version is None:
                logger.debug("xlkv_autopatch: vLLM is not installed; nothing to patch")
                return True
            groups = self.groups_for(version)
            try:
                self.check_version(version)
            except XlkvUnsupportedVersion as err:
                st.refusal = str(err)

                def refuse(_module, _message=st.refusal):
                    raise XlkvUnsupportedVersion(_message)

                # Loud at vLLM import (or now, if vLLM is already imported: wrapt runs the
                # hook at once).  Processes that never import vLLM (pip, ...) are untouched.
                # The ``always`` groups (the connector-factory guard) repeat the refusal at
                # every NIXL connector, so a second ``import vllm`` cannot run stock.
                wrapt.register_post_import_hook(refuse, "vllm")
                groups = [g for g in groups if g.always]
            for group in groups:
                if group.knob and knob_state(group.knob) != "on":
                    continue  # a switch that is off wraps nothing (status says what it would do)
                wrapt.register_post_import_hook(self._hook(group), group.trigger)
            return True

    def _hook(self, group):
        def hook(_module):
            self.apply_group(group)

        return hook

    def apply_group(self, group):
        """Resolve every spec of ``group``, then apply all of them or none."""
        with self._lock:
            st = self.state
            if not st.active:
                return []
            if group.precheck is not None:
                try:
                    group.precheck()  # a conflict that names its own cause and fix (kvcached)
                except XlkvError as err:
                    st.group_refusals[group.name] = (type(err), "%s (patch set %s)" % (err, group.name))
                    raise
            try:
                resolved = [resolve(spec) for spec in group.patches]
            except XlkvError as err:
                message = "%s (vLLM %s, patch set %s); %s" % (err, st.version, group.name, fix(self.supported))
                st.group_refusals[group.name] = (type(err), message)
                raise type(err)(message) from err
            applied = []
            try:
                for r in resolved:
                    if not r.already:
                        applied.append(self._apply(r))
            except Exception as err:  # undo, so no process runs half-patched
                for rec in reversed(applied):
                    self._revert(rec)
                message = ("xlkv_autopatch: could not apply patch set %s on vLLM %s: %s; %s"
                           % (group.name, st.version, err, fix(self.supported)))
                st.group_refusals[group.name] = (XlkvGuardError, message)
                raise XlkvGuardError(message) from err
            st.records.extend(applied)
            if group.name not in st.applied_groups:  # also when a fork found it all in place
                st.applied_groups.append(group.name)
            if applied:
                logger.info(
                    "xlkv_autopatch: patched %s (vllm %s, patch set %s, source=%s, pid=%d)",
                    ", ".join("%s.%s" % (describe(r.holder), r.spec.attr) for r in applied),
                    st.version,
                    group.name,
                    "+".join(st.sources),
                    os.getpid(),
                )
                warn_inert_knobs()   # the process's modules now say more (NVIDIA Dynamo's worker imports vLLM)
            return applied

    def _gate(self, spec):
        registry = self
        getter = spec.kind == "property"

        def gate(wrapped, instance, args, kwargs):
            if not registry.state.active:
                return wrapped(*args, **kwargs)
            registry._first_call(spec)
            if getter:  # property.fget(obj) is a plain call: hand the object over as instance
                instance = args[0]
            return spec.wrapper(wrapped, instance, args, kwargs)

        return gate

    def _first_call(self, spec):
        st = self.state
        if spec.name not in st.first_calls:
            st.first_calls.add(spec.name)
            logger.info("xlkv_autopatch: %s is active in this process (first call, pid=%d)", spec.name, os.getpid())

    def _apply(self, r):
        spec = r.spec
        if spec.kind in ("method", "function", "classmethod"):
            # For a classmethod wrapt binds the raw descriptor, so the wrapper sees the
            # class it was called on as ``instance`` (not the class that defines it).
            wrapper = XlkvFunctionWrapper(r.original, self._gate(spec))
        elif spec.kind == "property":
            p = r.original
            wrapper = XlkvProperty(XlkvFunctionWrapper(p.fget, self._gate(spec)), p.fset, p.fdel, p.__doc__)
        else:  # attribute
            registry = self

            def compute(original, instance, owner):
                if not registry.state.active:
                    return original
                registry._first_call(spec)
                return spec.wrapper(original, instance, owner)

            wrapper = XlkvAttribute(r.original, compute, spec.attr)
        setattr(r.holder, spec.attr, wrapper)
        return Record(spec, r.holder, r.original, r.had_own, wrapper)

    # -- undo ------------------------------------------------------------------
    def _revert(self, rec):
        current = vars(rec.holder).get(rec.spec.attr)
        if current is not rec.wrapper:
            logger.warning(
                "xlkv_autopatch: %s.%s was changed by someone else; leaving it alone",
                describe(rec.holder),
                rec.spec.attr,
            )
            return
        if rec.had_own:
            setattr(rec.holder, rec.spec.attr, rec.original)
        else:
            delattr(rec.holder, rec.spec.attr)

    def uninstall(self):
        """Restore every patched attribute; pending hooks become no-ops."""
        with self._lock:
            st = self.state
            st.active = False
            for rec in reversed(st.records):
                self._revert(rec)
            reverted = len(st.records)
            st.records.clear()
            st.applied_groups.clear()
            st.installed = False
            st.sources.clear()
            st.refusal = None
            st.group_refusals.clear()
            facts.reset()
            return reverted

    @staticmethod
    def attached_to(cls):
        """Names of the xlkv wrappers that sit on ``cls`` or one of its base classes (placed by
        this registry or inherited across a fork)."""
        return sorted({name for k in getattr(cls, "__mro__", ()) for name, value in vars(k).items()
                       if isinstance(value, OURS)})

    def unapplied_nixl_groups(self):
        """(group, why) for every NIXL patch set of this release that is not applied."""
        out = []
        for g in self.groups_for(self.state.version):
            if not g.nixl or g.name in self.state.applied_groups:
                continue
            if g.name in self.state.group_refusals:
                why = "it was refused: %s" % self.state.group_refusals[g.name][1]
            elif g.trigger not in sys.modules:
                why = "its trigger module %s was never imported" % g.trigger
            else:
                why = "its trigger module %s is imported but the set was not applied" % g.trigger
            out.append((g, why))
        return out

    def applied(self):
        return [(r.spec.name, describe(r.holder), r.spec.attr) for r in self.state.records]


REGISTRY = Registry()


def warn_inert_knobs():
    """A knob set on that does nothing here (XLKV_EQUAL_TP on 0.29+, XLKV_DETOK_TAIL where the detokenizer primes no
    prompt or in NVIDIA Dynamo's worker): one WARNING per knob and process, in the words ``status`` prints for it
    (facts.knob_no_effect: the run and status say the same).  Called at start-up and after each patch set applied,
    when the process's modules (Dynamo's worker) are known."""
    from .flag import KNOBS

    for k in KNOBS:
        why = facts.knob_no_effect(k.name, facts.current(), "on")
        if why and once(("no-effect", k.name)):
            logger.warning("xlkv_autopatch: %s is set, but %s", k.name, why)
