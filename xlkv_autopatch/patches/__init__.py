"""The patch sets, one file per vLLM concept they change (see each module's docstring).

:func:`all_groups` returns every :class:`~xlkv_autopatch.registry.PatchGroup`; the
registry keeps those whose version range contains the installed vLLM.
"""


def all_groups():
    return []
