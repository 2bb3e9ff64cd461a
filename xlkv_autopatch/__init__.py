"""xlkv_autopatch: cross-layer KV-cache transfers for vLLM's NixlConnector, as import hooks.

vLLM's plugin loader imports this module in every vLLM process, flag on or off, so it
stays standard-library only: no wrapt, no vLLM, no torch here.  The public API loads the
registry lazily.
"""

from ._version import __version__

__all__ = ["__version__", "install", "uninstall", "status", "is_enabled"]


def is_enabled(environ=None):
    """True when ENABLE_XLKV is one of 1/true/yes/on (case-insensitive)."""
    from .flag import flag_on

    return flag_on(environ)


def install(source="api"):
    """Register the post-import hooks that patch vLLM (idempotent)."""
    from . import patches, registry

    return registry.REGISTRY.install(source=source, groups_provider=patches.all_groups)


def uninstall():
    """Undo every patch this process applied, restoring the original attributes exactly."""
    from . import registry

    return registry.REGISTRY.uninstall()


def status(resolve=True):
    """A dict describing the installed vLLM, the flag, the activation paths and the patches."""
    from . import status_report

    return status_report.collect(resolve=resolve)
