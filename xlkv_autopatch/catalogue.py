"""The patch catalogue: every vLLM attribute the shim wraps, in which releases, and where.

Derived from :func:`xlkv_autopatch.patches.all_groups` (itself derived from the release table,
:mod:`xlkv_autopatch.releases`), never written by hand: docs/mechanism.md carries its rendering
between :data:`START` and :data:`END`; ``python -m xlkv_autopatch.catalogue --write`` rewrites
it and tests/unit/test_structure.py fails on a stale one.
"""

import os
import sys

from . import patches, releases, versions

START = "<!-- patch catalogue: python -m xlkv_autopatch.catalogue --write renders it from the release table -->"
END = "<!-- end of the patch catalogue -->"
DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "mechanism.md")
_PREFIX = "vllm.distributed.kv_transfer.kv_connector."


def _releases_text(rels):
    """"0.12–0.19, 0.24" for table releases, consecutive rows joined."""
    order = [r.release for r in releases.RELEASES]
    idx = sorted(order.index(r) for r in set(rels))
    runs = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(order[a] if a == b else "%s–%s" % (order[a], order[b]) for a, b in runs)


def entries():
    """[(file, attribute, releases text, where text)] in the order the groups first declare them;
    attributes attached at run time (:data:`patches.INSTANCE_PATCHES`) last."""
    groups = patches.all_groups()
    seen = {}  # (file, attr) -> {"rels": [...], "where": [(owner, module, release)], "always": bool}
    by_spec = {}  # spec name -> releases
    for g in groups:
        rows = list(releases.RELEASES) if g.always else [
            r for r in releases.RELEASES if versions.in_range(r.release + ".0", g.vllm)]
        for s in g.patches:
            e = seen.setdefault((s.name.split(".")[0], s.attr), {"rels": [], "where": [], "always": g.always})
            for r in rows:
                e["rels"].append(r.release)
                e["where"].append((s.owner or s.attr, s.module, r.release))
                by_spec.setdefault(s.name, []).append(r.release)
    files = list(dict.fromkeys(fname for fname, _ in seen))
    out = []
    for (fname, attr), e in sorted(seen.items(), key=lambda kv: files.index(kv[0][0])):  # stable: attrs in order
        where = {}
        for owner, module, rel in e["where"]:
            where.setdefault(owner, {}).setdefault(module, []).append(rel)
        text = "; ".join("%s: %s" % ("module function" if owner == attr else "`%s`" % owner, ", ".join(
            "`%s` %s" % (module.replace(_PREFIX, ""), "(all)" if e["always"] else _releases_text(rels))
            for module, rels in modules.items())) for owner, modules in where.items())
        out.append((fname, attr, "all" if e["always"] else _releases_text(e["rels"]), text))
    for (fname, attr, what), spec in patches.INSTANCE_PATCHES.items():
        out.append((fname, attr, _releases_text(by_spec[spec]), "%s, attached by `%s`" % (what, spec)))
    return out


def render():
    lines = ["| file | attribute | vLLM releases | where: class, module (`v1.…` and `factory` are under `%s`) |"
             % _PREFIX.rstrip("."), "|---|---|---|---|"]
    for fname, attr, rels, where in entries():
        lines.append("| `%s` | `%s` | %s | %s |" % (fname, attr, rels, where))
    return "\n".join(lines)


def rendered_in(text):
    """The catalogue between the markers of ``text`` (docs/mechanism.md), or None."""
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def write(path=DOC):
    text = open(path).read()
    if rendered_in(text) is None:
        raise SystemExit("%s has no catalogue markers (%s ... %s)" % (path, START, END))
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w") as f:
        f.write("%s%s\n%s\n%s%s" % (head, START, render(), END, tail))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--write"]:
        write()
        return 0
    print(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
