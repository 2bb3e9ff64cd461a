"""Exceptions raised on purpose, each naming the cause and the fix."""


class XlkvError(RuntimeError):
    """Base class: a configuration xlkv_autopatch refuses to run with."""


class XlkvUnsupportedVersion(XlkvError):
    """The installed vLLM release is outside the range the patches support."""


class XlkvGuardError(XlkvError):
    """A patch target does not have the shape the patch was written for."""


class XlkvMismatchError(XlkvError):
    """Prefill and decode (or two patch sets) disagree about the KV layout."""
