"""Exceptions raised on purpose, each naming the cause and the fix.  Standard library only."""


class XlkvError(RuntimeError):
    """Base class: a configuration xlkv_autopatch refuses to run with."""


class XlkvFlagError(XlkvError):
    """A knob (ENABLE_XLKV or an XLKV_* knob of flag.KNOBS) has a value that is neither on nor off."""


class XlkvDependencyError(XlkvError):
    """A runtime dependency of the shim (wrapt, packaging) is missing."""


class XlkvUnsupportedVersion(XlkvError):
    """The installed vLLM release is outside the range the patches support."""


class XlkvGuardError(XlkvError):
    """A patch target does not have the shape the patch was written for."""


class XlkvNotAttachedError(XlkvError):
    """ENABLE_XLKV is on, vLLM made a NIXL connector, and the patch set for it is not in place."""


class XlkvMismatchError(XlkvError):
    """Prefill and decode disagree about the KV layout, block size or TP slicing."""


class XlkvRegistrationError(XlkvError):
    """This engine's own KV tensors cannot be registered with NIXL safely."""
