"""vLLM general plugin (entry point group ``vllm.general_plugins``).  Standard library only.

vLLM calls :func:`register` once in every process it starts (API server, engine core,
workers), before it imports a KV connector.  This covers what the ``.pth`` hook cannot:
``ENABLE_XLKV`` set inside a script after start-up, editable installs whose ``.pth`` is
missing, interpreters started with ``-S``, and Ray workers whose environment arrives
late.  Errors raised here are deliberate (unsupported vLLM, an unrecognised flag value, a
missing dependency, a failed guard) and stop vLLM start-up with a message that names the
cause and the fix.
"""

from ._startup import activate


def register():
    activate("vllm_plugin")
