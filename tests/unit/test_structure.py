"""The package's shape: the patch table in patches/__init__.py is what all_groups() declares,
every patch file documents why/how/versions/removal, and no module imports another in a circle."""

import ast
import os
import re

import xlkv_autopatch
from xlkv_autopatch import patches
from xlkv_autopatch.patches import all_groups

PKG = os.path.dirname(os.path.abspath(xlkv_autopatch.__file__))


def _table_rows():
    """[(file, attribute name, releases)] from the docstring table."""
    doc = patches.__doc__
    body = doc.split("=====\n", 2)[2].split("\n=====", 1)[0]  # between the header rule and the closing rule
    rows, current = [], None
    for line in body.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        file_col, rest = line[:27].strip(), line[27:]
        current = file_col or current
        attrs, releases = rest[:53].strip(), rest[53:].strip()
        for attr in [a.strip() for a in attrs.split(",") if a.strip()]:
            name = re.sub(r"\s*\(.*\)$", "", attr).split(".")[-1]
            rows.append((current, name, releases))
    return rows


def _minor(spec, lower):
    m = re.search(r"%s0\.(\d+)" % (">=" if lower else "<"), spec)
    return int(m.group(1)) if m else None


def _declared():
    """{(file, attribute): "0.A-0.B" or "all"} from all_groups()."""
    spans = {}
    for g in all_groups():
        for spec in g.patches:
            key = (spec.name.split(".")[0], spec.attr)
            if g.always:
                spans[key] = "all"
                continue
            lo, hi = _minor(g.vllm, True), _minor(g.vllm, False) - 1
            old = spans.get(key)
            spans[key] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
    return {k: v if v == "all" else "0.%d-0.%d" % v for k, v in spans.items()}


def test_patch_table_matches_all_groups():
    table = {(f, a): r for f, a, r in _table_rows()}
    assert table == {**_declared(), **patches.INSTANCE_PATCHES}


def test_every_patch_file_is_in_the_table_and_documented():
    files = {f[:-3] for f in os.listdir(os.path.join(PKG, "patches")) if f.endswith(".py") and not f.startswith("_")}
    assert files == {f for f, _, _ in _table_rows()}
    for name in files:
        doc = ast.get_docstring(ast.parse(open(os.path.join(PKG, "patches", name + ".py")).read()))
        for heading in ("Why", "How", "vLLM versions", "Removal"):
            assert re.search(r"^%s$" % heading, doc, re.M), (name, heading)


def _imports():
    """{module: {package modules it imports}} over every import statement, in functions too."""
    graph = {}
    for folder, _, names in os.walk(PKG):
        for fname in names:
            if not fname.endswith(".py"):
                continue
            path = os.path.join(folder, fname)
            rel = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".")
            mod = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
            package = mod if fname == "__init__.py" else mod.rsplit(".", 1)[0]
            deps = set()
            for node in ast.walk(ast.parse(open(path).read())):
                if isinstance(node, ast.ImportFrom):
                    base = package.split(".")
                    if node.level:
                        base = base[:len(base) - node.level + 1]
                        target = ".".join(base + ([node.module] if node.module else []))
                    else:
                        target = node.module or ""
                    if not target.startswith("xlkv_autopatch"):
                        continue
                    for alias in node.names:
                        sub = target + "." + alias.name
                        deps.add(sub if os.path.exists(os.path.join(os.path.dirname(PKG), *sub.split(".")) + ".py")
                                 or os.path.isdir(os.path.join(os.path.dirname(PKG), *sub.split("."))) else target)
                elif isinstance(node, ast.Import):
                    deps.update(a.name for a in node.names if a.name.startswith("xlkv_autopatch"))
            deps.discard(mod)
            graph[mod] = deps
    return graph


def _cycles(graph):
    cycles = []

    def visit(node, path):
        for dep in sorted(graph.get(node, ())):
            if dep in path:
                cycles.append(path[path.index(dep):] + [dep])
            elif len(path) < 30:
                visit(dep, path + [dep])

    for start in sorted(graph):
        visit(start, [start])
    return cycles


def test_no_module_imports_another_in_a_circle():
    graph = _imports()
    assert "xlkv_autopatch.registry" in graph and "xlkv_autopatch.patches" in graph
    assert _cycles(graph) == []


def test_the_circle_finder_sees_a_planted_circle():
    graph = _imports()
    assert "xlkv_autopatch.registry" in graph["xlkv_autopatch.patches.kv_connector_factory"]
    graph["xlkv_autopatch.registry"] = graph["xlkv_autopatch.registry"] | {"xlkv_autopatch.patches"}
    assert any(c[0] == c[-1] and "xlkv_autopatch.registry" in c for c in _cycles(graph))
