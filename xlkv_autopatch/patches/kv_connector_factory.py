"""KVConnectorFactory.create_connector: with ENABLE_XLKV on, a NIXL connector is patched or vLLM stops.

Why
    Every other patch attaches when the module it targets is imported.  When the vLLM
    code is not where the release it reports keeps it (``XLKV_VLLM_VERSION`` pointing at
    another release, a fork, a dev build whose version names the next release), a patch
    set can wait for a module that is never imported, and vLLM runs stock although the
    operator asked for the cross-layer layout, with no log line.  Likewise, after vLLM
    refused an unsupported release once, a second ``import vllm`` in the same process
    would succeed with nothing patched.
How
    The factory classmethod is wrapped for *every* vLLM release (this group is registered
    whatever the release, supported or not).  After the original created a connector, if
    it is a NIXL connector (by class name, pull/push included; MultiConnector children are
    created through the same factory), the wrapper checks that an xlkv wrapper sits on the
    connector's class hierarchy and, for a worker-side connector, on its worker's class,
    and that every NIXL patch set of this release was applied.  If not, it raises
    XlkvNotAttachedError naming the release, the patch sets expected, why they did not
    attach and the fix; an unsupported release, and a patch set refused when its module
    was imported (kvcached's autopatch, a failed shape guard) whose error a caller caught,
    repeat that refusal here instead.  Documented
    fallbacks (the stock layout kept with a WARNING) are not affected: the patches are
    in place there and made that decision.
vLLM versions
    All (the supported ones, releases.py's range; for others it repeats the refusal).  The factory's
    ``create_connector(cls, config, role, kv_cache_config)`` exists in every one of them;
    the wrapper reads only the returned object.
Removal
    Never while patch sets attach on import: it is the check that they did.
"""

from .. import registry, versions
from ..errors import XlkvNotAttachedError, XlkvUnsupportedVersion
from ..releases import CONNECTOR_FACTORY
from ..specs import Target
from ._config import NIXL_CONNECTORS


def _is_nixl(connector):
    return any(k.__name__ in NIXL_CONNECTORS for k in type(connector).__mro__)


def problems(connector, reg=None):
    """What is not in place for ``connector`` (a list of sentences; empty when all is)."""
    reg = reg or registry.REGISTRY
    out = []
    if not reg.attached_to(type(connector)):
        out.append("no xlkv wrapper on %s.%s or its base classes"
                   % (type(connector).__module__, type(connector).__qualname__))
    worker = getattr(connector, "connector_worker", None)
    if worker is not None and not reg.attached_to(type(worker)):
        out.append("no xlkv wrapper on its worker %s.%s" % (type(worker).__module__, type(worker).__qualname__))
    for group, why in reg.unapplied_nixl_groups():
        out.append("patch set %s (for vLLM %s) did not attach: %s" % (group.name, group.vllm, why))
    return out


def _fix(reg):
    if versions.override_differs():
        return ("%s, and the code of that release is not what is installed. Fix: %s, or unset ENABLE_XLKV"
                % (versions.override_sentence(), versions.unset_override()))
    return ("this vLLM build's code is not where release %s keeps it (a fork, or a development build between two "
            "releases). Fix: install a vLLM release xlkv supports (%s), set %s to the release whose code this build "
            "carries, or unset ENABLE_XLKV" % (reg.state.version, reg.supported, versions.OVERRIDE))


def check(connector, reg=None):
    reg = reg or registry.REGISTRY
    if not _is_nixl(connector):
        return
    if reg.state.refusal:
        raise XlkvUnsupportedVersion(reg.state.refusal + " (repeated: vLLM went on to create a NIXL connector)")
    for group, _why in reg.unapplied_nixl_groups():
        refused = reg.state.group_refusals.get(group.name)
        if refused is not None:  # a caller caught the refusal at import: the same cause, once more
            error_type, message = refused
            raise error_type(message + " (repeated: vLLM went on to create a NIXL connector)")
    found = problems(connector, reg)
    if found:
        raise XlkvNotAttachedError(
            "xlkv_autopatch: ENABLE_XLKV is set and vLLM created a NIXL connector (%s), but xlkv's patches are not in "
            "place for it, so it would run the stock layout: %s. The patch sets were chosen for vLLM %s; %s"
            % (type(connector).__name__, "; ".join(found), reg.state.version, _fix(reg)))


def factory_wrapper(wrapped, cls, args, kwargs):
    connector = wrapped(*args, **kwargs)
    check(connector)
    return connector


#: what this file wraps: the connector factory, whatever the release (the ``guard`` set, registered for
#: unsupported releases too)
TARGETS = (
    Target(name="kv_connector_factory.guard", group="guard", module=CONNECTOR_FACTORY, owner="KVConnectorFactory",
           attr="create_connector", kind="classmethod", wrapper=factory_wrapper),
)
