"""Declarations of what to patch: :class:`Target` (what a patch module wraps, for which release
rows), :class:`PatchSpec` (one attribute of one release) and :class:`PatchGroup` (specs applied
together).  Plain data, no wrapt and no vLLM: the patch modules (their ``TARGETS``), the groups
:mod:`xlkv_autopatch.patches` composes from them and the machinery in
:mod:`xlkv_autopatch.registry` all import this module and not each other."""

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Tuple, Union

KINDS = ("method", "classmethod", "property", "function", "attribute")


@dataclass(frozen=True)
class PatchSpec:
    """One wrapped attribute.

    ``wrapper(wrapped, instance, args, kwargs)`` is a wrapt-style wrapper (for a property,
    ``instance`` is the object and ``wrapped`` the original getter).  For kind
    ``attribute`` (a plain class attribute such as a ``ClassVar[bool]``) it is called as
    ``wrapper(original_value, instance, owner_class)`` and returns the value to expose;
    the spec then installs a descriptor on the *named* class (``on_named_class``).
    ``params``: the target's parameter names, checked before patching, required whenever
    the wrapper reads arguments by position; a last element ``"..."`` allows more
    parameters after the ones named.
    """

    name: str
    module: str
    owner: Optional[str]  # class name in ``module``; None for a module-level function
    attr: str
    kind: str
    wrapper: Callable
    params: Optional[Tuple[str, ...]] = None  # expected parameter names, None = unchecked
    on_named_class: bool = False  # True: override on the named class, not the MRO owner

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError("unknown patch kind %r" % (self.kind,))
        if self.kind == "function" and self.owner is not None:
            raise ValueError("a module function has no owner class")

    @property
    def target(self):
        return "%s:%s" % (self.module, "%s.%s" % (self.owner, self.attr) if self.owner else self.attr)


@dataclass(frozen=True)
class PatchGroup:
    """Specs applied together when ``trigger`` is imported, for vLLM versions ``vllm``.

    ``nixl``: the group patches NIXL connector code, so a NIXL connector created while it
    is not applied stops vLLM (patches/kv_connector_factory.py).  ``knob``: registered only
    while that knob is on (a switch such as XLKV_DETOK_TAIL).  ``always``: registered
    whatever the vLLM release, supported or not (that guard itself); ``vllm`` is then
    informational.
    """

    name: str
    trigger: str
    vllm: str
    patches: Tuple[PatchSpec, ...]
    precheck: Optional[Callable[[], None]] = None  # raise XlkvError to refuse
    nixl: bool = True
    always: bool = False
    #: a switch's knob (flag.KNOBS): the group is registered only while that knob is on, so a switch
    #: that is off wraps nothing (None: registered whatever the knobs)
    knob: Optional[str] = None


@dataclass(frozen=True)
class FromRow:
    """A target value that differs between releases, read from the release row
    (:class:`xlkv_autopatch.releases.Release`): ``path`` is a dotted attribute path of the row,
    such as ``"home.worker"``."""

    path: str

    def of(self, row):
        value = row
        for part in self.path.split("."):
            value = getattr(value, part)
        return value


#: where a release keeps its NIXL code (the row's ``nixl`` column, releases.NixlHome)
NIXL_CONNECTOR_MODULE = FromRow("home.connector")
NIXL_WORKER_MODULE = FromRow("home.worker")
NIXL_WORKER_CLASS = FromRow("home.worker_class")


def _value(value, row):
    return value.of(row) if isinstance(value, FromRow) else value


@dataclass(frozen=True)
class Target:
    """One attribute a patch module wraps, declared beside its wrapper (the module's ``TARGETS``).

    ``group``: the patch set it joins (``nixl``: the release's NIXL set; ``runner``, ``packed``,
    ``multi``, ``guard``: see :mod:`xlkv_autopatch.patches`, which composes the sets per release
    row).  ``when``: the release-table columns that select it, ``{column: value}`` or
    ``{column: (values, ...)}``, every one matching (empty: every row).  ``module``, ``owner`` and
    ``params`` may be a :class:`FromRow`, read from the selected row; the rest is
    :class:`PatchSpec`'s.  ``params`` names the parameters the wrapper binds by name
    (``_args.bind``), so the registry checks their positions before patching.
    """

    name: str
    group: str
    module: Union[str, FromRow]
    owner: Union[None, str, FromRow]
    attr: str
    kind: str
    wrapper: Callable
    params: Union[None, Tuple[str, ...], FromRow] = None
    on_named_class: bool = False
    when: Tuple[Tuple[str, Any], ...] = field(default=())

    def __post_init__(self):
        if isinstance(self.when, dict):
            object.__setattr__(self, "when", tuple(self.when.items()))

    def selects(self, row):
        """Whether release row ``row`` has this target (every ``when`` column matches)."""
        return all(getattr(row, column) in (want if isinstance(want, tuple) else (want,))
                   for column, want in self.when)

    def spec(self, row):
        """The :class:`PatchSpec` of this target on release row ``row``."""
        return PatchSpec(name=self.name, module=_value(self.module, row), owner=_value(self.owner, row),
                         attr=self.attr, kind=self.kind, wrapper=self.wrapper, params=_value(self.params, row),
                         on_named_class=self.on_named_class)


@dataclass(frozen=True)
class Attached:
    """A wrapper a patch module places on objects at run time rather than through a Target
    (declared as the module's ``ATTACHED``): ``attr`` and ``what`` it wraps, and ``by``, the
    target whose wrapper attaches it (so its releases are that target's)."""

    attr: str
    what: str
    by: str
