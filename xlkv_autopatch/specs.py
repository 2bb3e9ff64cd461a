"""Declarations of what to patch: :class:`PatchSpec` (one attribute) and :class:`PatchGroup`
(specs applied together).  Plain data, no wrapt and no vLLM: the groups in
:mod:`xlkv_autopatch.patches` and the machinery in :mod:`xlkv_autopatch.registry` both
import this module and not each other."""

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

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
    is not applied stops vLLM (patches/kv_connector_factory.py).  ``always``: registered
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
