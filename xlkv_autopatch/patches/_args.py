"""Arguments of a wrapped call, by parameter name."""


def bind(args, kwargs, *names):
    """Positional-or-keyword arguments of a wrapped call, by name (self excluded).

    Only for targets whose PatchSpec checks ``params``: the positions are the ones the
    registry verified before patching.
    """
    out = []
    for i, n in enumerate(names):
        if n in kwargs:
            out.append(kwargs[n])
        elif i < len(args):
            out.append(args[i])
        else:
            out.append(None)
    return out
