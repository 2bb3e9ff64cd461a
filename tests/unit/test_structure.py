"""The package's shape: the docs' patch catalogue is the one derived from the release table, every
patch file documents why/how/versions/removal, no module imports another in a circle, and no module
imports one of a higher floor."""

import ast
import os
import re
import sys
from pathlib import Path

import xlkv_autopatch
from xlkv_autopatch.patches import all_groups

PKG = os.path.dirname(os.path.abspath(xlkv_autopatch.__file__))


# a docs renderer outside the package (it ships in no wheel), imported from the checkout's tools/ as
# test_measurement_figures.py imports docfigures
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools"))
import catalogue  # noqa: E402


def test_docs_tables_are_the_rendered_ones():
    """docs/mechanism.md's mechanism table and patch catalogue are what tools/catalogue.py derives from
    the release table."""
    text = open(catalogue.DOC).read()
    for start, end, renderer in catalogue.BLOCKS:
        assert catalogue.rendered_in(text, start, end) == renderer(), (
            "docs/mechanism.md's %s is stale: python3 tools/catalogue.py --write" % renderer.__name__)


def test_every_patch_file_is_in_the_catalogue_and_documented():
    files = {f[:-3] for f in os.listdir(os.path.join(PKG, "patches")) if f.endswith(".py") and not f.startswith("_")}
    assert files == {f for f, _, _, _ in catalogue.entries()}
    for name in files:
        doc = ast.get_docstring(ast.parse(open(os.path.join(PKG, "patches", name + ".py")).read()))
        for heading in ("Why", "How", "vLLM versions", "Removal"):
            assert re.search(r"^%s$" % heading, doc, re.M), (name, heading)


def test_group_names_are_unique_and_each_range_lies_in_the_supported_one():
    from xlkv_autopatch import releases, versions

    groups = all_groups()
    assert len({g.name for g in groups}) == len(groups)
    for g in groups:
        if not g.always:
            lo, hi = re.fullmatch(r">=(\d+\.\d+),<(\d+\.\d+)", g.vllm).groups()
            assert versions.in_range(lo + ".0", releases.supported_range()), g.name
            assert versions.parse(hi) <= versions.parse(releases.supported_range().split("<")[1]), g.name


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


#: import floors, lowest first: a module imports only modules of its own floor or lower ones.
#: base: standard library and packaging only (what the flag-off path and the release table need);
#: machinery: wrapt hooks; patches: the vLLM glue; front: entry points and reports.
FLOORS = (
    ("base", {"_version", "errors", "flag", "logs", "layout", "families", "specs", "versions", "releases", "facts",
              "_pth", "prompt_tail", "block_sizes"}),
    ("machinery", {"registry"}),
    ("patches", {"patches"}),
    ("front", {"", "__main__", "_startup", "plugin", "status_report", "model_report"}),
)


def _floor(module):
    rel = module[len("xlkv_autopatch"):].lstrip(".")
    top = rel.split(".")[0]
    for i, (_, names) in enumerate(FLOORS):
        if top in names:
            return i
    raise AssertionError("%s has no floor in test_structure.FLOORS: add it" % module)


def _upward(graph):
    return sorted((a, b) for a, deps in graph.items() for b in deps if _floor(b) > _floor(a))


def test_every_module_has_a_floor_and_no_floor_imports_a_higher_one():
    graph = _imports()
    for mod in graph:
        _floor(mod)
    assert _upward(graph) == []


def test_the_floor_check_sees_a_planted_upward_import():
    graph = _imports()
    graph["xlkv_autopatch.releases"] = graph["xlkv_autopatch.releases"] | {"xlkv_autopatch.registry"}
    graph["xlkv_autopatch.registry"] = graph["xlkv_autopatch.registry"] | {"xlkv_autopatch.patches"}
    assert _upward(graph) == [("xlkv_autopatch.registry", "xlkv_autopatch.patches"),
                              ("xlkv_autopatch.releases", "xlkv_autopatch.registry")]


def test_test_files_have_distinct_basenames():
    """pytest imports test files as top-level modules (no __init__.py in tests/): two files with one
    basename make the whole run stop at collection (2026-11-24: tests/unit and tests/real both had
    test_handoff_levers.py; each passed alone, the full run collected nothing)."""
    seen = {}
    for path in sorted((Path(__file__).resolve().parents[1]).rglob("test_*.py")):
        assert path.name not in seen, (path, seen[path.name])
        seen[path.name] = path
    assert len(seen) > 30


#: the lab's importable names (experiments/: its package, its modules, the hook's) and the CPU harness's
#: (tests/harness/)
LAB_NAMES = {"experiments", "pdtools", "pdharness", "model_shapes", "make_model", "pd_proxy", "report",
             "wire_copy", "families_matrix", "one_kv_head", "stock_layout_order", "pd_harness",
             "xlkv_negative_control", "model_check"}


def _lab_imports(source):
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [n for n in names if n.split(".")[0] in LAB_NAMES]
    return found


def test_the_product_never_imports_the_lab():
    """The lab (experiments/) imports the product, never the other way round."""
    found = {}
    for folder, _, names in os.walk(PKG):
        for fname in names:
            if fname.endswith(".py"):
                path = os.path.join(folder, fname)
                hits = _lab_imports(open(path).read())
                if hits:
                    found[os.path.relpath(path, os.path.dirname(PKG))] = hits
    assert found == {}
    assert _lab_imports("import os\nfrom pdtools.gates import gate\n") == ["pdtools.gates"]  # the check sees one


# ---------------------------------------------------------------------- patch targets beside their wrappers


def _patch_files():
    folder = os.path.join(PKG, "patches")
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and not f.startswith("_"))


def test_every_patch_file_declares_its_own_targets():
    """A patch module declares what it wraps (TARGETS, or ATTACHED for a wrapper placed at
    run time) beside its wrappers; patches/__init__.py composes every module's."""
    from xlkv_autopatch import patches
    from xlkv_autopatch.specs import Attached, Target

    assert sorted(m.__name__.rsplit(".", 1)[-1] for m in patches.MODULES) == _patch_files()
    names, attached = set(), []
    for module in patches.MODULES:
        short = module.__name__.rsplit(".", 1)[-1]
        targets, extra = getattr(module, "TARGETS", ()), getattr(module, "ATTACHED", ())
        assert targets or extra, "%s declares no TARGETS or ATTACHED" % short
        for t in targets:
            assert isinstance(t, Target) and t.name.startswith(short + "."), (short, t)
            assert t.wrapper.__module__ == module.__name__, (short, t.name, t.wrapper)  # its own wrapper
            names.add(t.name)
        assert all(isinstance(a, Attached) for a in extra)
        attached += extra
    assert attached and all(a.by in names for a in attached)


def test_every_target_is_selected_by_release_table_columns():
    """A target's ``when`` names columns of the release table and values they take, and selects at
    least one row (the guard: every release)."""
    from xlkv_autopatch import patches, releases

    columns = releases.Release.__dataclass_fields__
    for module in patches.MODULES:
        for t in getattr(module, "TARGETS", ()):
            for column, want in t.when:
                assert column in columns, (t.name, column)
                taken = {getattr(r, column) for r in releases.RELEASES}
                assert set(want if isinstance(want, tuple) else (want,)) <= taken, (t.name, column, want, taken)
            assert t.group == patches.GUARD or any(t.selects(r) for r in releases.RELEASES), t.name


def test_patches_init_only_composes():
    """patches/__init__.py builds no target and names no vLLM attribute or parameter: the modules do."""
    tree = ast.parse(open(os.path.join(PKG, "patches", "__init__.py")).read())
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not calls & {"Target", "PatchSpec"}, calls
    keywords = {k.arg for n in ast.walk(tree) if isinstance(n, ast.Call) for k in n.keywords}
    assert not keywords & {"attr", "params", "owner", "wrapper", "kind"}, keywords


def _bound_names(function):
    """The parameter names each ``bind(args, kwargs, ...)`` call in ``function`` passes: string
    literals, or ``*NAME`` of a tuple in the function's module."""
    import inspect
    import sys
    import textwrap

    module = sys.modules[function.__module__]
    out = []
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(function)))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bind":
            names = []
            for arg in node.args[2:]:
                if isinstance(arg, ast.Starred):
                    names.extend(getattr(module, arg.value.id))
                else:
                    names.append(arg.value)
            out.append(tuple(names))
    return out


def _bind_mismatches(spec):
    """Where ``spec``'s wrapper binds names other than its target's leading parameters (after
    self/cls for a method): bind() falls back to positions, which the registry checks by ``params``."""
    lead = tuple(p for p in (spec.params or ()) if p != "...")
    if spec.kind in ("method", "classmethod"):
        lead = lead[1:]
    return [(spec.name, names, lead) for names in _bound_names(spec.wrapper)
            if spec.params is None or names != lead[:len(names)]]


def test_every_wrapper_binds_its_targets_leading_parameters():
    """The positions bind() falls back to are the ones the registry checked (the params of the same
    module's target), on every release."""
    bound = set()
    for g in all_groups():
        for s in g.patches:
            assert _bind_mismatches(s) == []
            bound.update(s.name for _ in _bound_names(s.wrapper))
    assert {"handshake.validate", "compat_hash.tag", "block_count.register_kv_caches"} <= bound


def test_the_bind_check_sees_a_planted_mismatch():
    from dataclasses import replace

    from xlkv_autopatch.patches import handshake

    spec = next(s for g in all_groups() for s in g.patches if s.name == "handshake.validate")
    planted = replace(spec, params=("self", "remote_tp_rank", "nixl_agent_meta", "remote_tp_size", "..."))
    assert _bind_mismatches(planted) == [("handshake.validate", handshake.VALIDATE_ARGS,
                                          ("remote_tp_rank", "nixl_agent_meta", "remote_tp_size"))]
    assert _bind_mismatches(replace(spec, params=None)) != []


# ---------------------------------------------------------------------- one owner per room


def _doc_paths(source):
    """String literals of ``source``'s code (docstrings left out) that name the docs folder or a markdown file:
    what a module that renders or reads the docs has, and production code never needs."""
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings and (n.value in ("docs", "docs/") or n.value.endswith(".md"))]


def test_each_room_holds_only_its_own():
    """The package ships only what runs in production (the docs renderers, catalogue.py
    among them, live in tools/); the CPU harness the real-vLLM tests drive lives in tests/harness/, not in the
    lab (experiments/), which runs it from there.  tests/README.md's table says who owns which folder."""
    root = os.path.dirname(PKG)
    found = {}
    for folder, _, names in os.walk(PKG):
        for fname in names:
            if fname.endswith(".py"):
                path = os.path.join(folder, fname)
                hits = _doc_paths(open(path).read())
                if hits:
                    found[os.path.relpath(path, root)] = hits
    assert found == {}
    assert _doc_paths('"""docs/x.md"""\nDOC = os.path.join(ROOT, "docs", "mechanism.md")\n') == ["docs", "mechanism.md"]
    for path in ("tools/catalogue.py", "tools/render_table.py", "tests/harness/pd_harness.py",
                 "tests/harness/pdharness/cli.py", "tests/harness/mkenv.sh"):
        assert os.path.isfile(os.path.join(root, path)), path
    for path in ("xlkv_autopatch/catalogue.py", "tests/compat", "experiments/cpu/pd_harness.py",
                 "experiments/cpu/pdharness", "experiments/cpu/mkenv.sh"):
        assert not os.path.exists(os.path.join(root, path)), path
