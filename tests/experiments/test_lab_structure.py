"""The lab's house (issue 35): experiments/pdtools is one package whose rooms are tied by imports,
on floors that import only downward (no circle, nothing that runs back up), with the jobs reached
from the one entry point; the lab's scripts outside it are imported or started by it."""

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXP = os.path.join(ROOT, "experiments")
PKG = os.path.join(EXP, "pdtools")

#: module -> floor; a module imports only from floors below its own (gates, the door to the shim's pure
#: modules, lies below the rooms that ask them: kvmetrics asks the package's model shapes through it)
FLOORS = {
    "gates": -1,
    "settings": 0, "client": 0, "prompts": 0, "vllminfo": 0, "kvmetrics": 0, "handoff": 0,
    "results": 1, "equivalence": 1, "configs": 1, "cpuchecks": 1,
    "runs": 2, "pair": 2, "report": 2,
    "job_equivalence": 3, "job_bench": 3, "job_upstream": 3,
    "job_cell": 4, "job_main": 4,
    "cli": 5,
    "__init__": 6, "__main__": 6,
}


def _imports():
    """module -> the package's modules it imports (relative imports; the jobs are plain imports of cli)."""
    graph = {}
    for path in sorted(glob.glob(os.path.join(PKG, "*.py"))):
        name = os.path.basename(path)[:-3]
        deps = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[name] = deps
    return graph


def test_every_room_has_a_floor_and_imports_only_downward():
    graph = _imports()
    assert set(graph) == set(FLOORS), "give every module of pdtools a floor: %s" % (set(graph) ^ set(FLOORS))
    up = ["%s (%d) imports %s (%d)" % (m, FLOORS[m], d, FLOORS[d]) for m, deps in graph.items() for d in deps
          if FLOORS[d] >= FLOORS[m]]
    assert up == []


def test_no_room_stands_apart():
    graph = _imports()
    used = set().union(*graph.values())
    apart = sorted(m for m in graph if m not in used and m not in ("__init__", "__main__"))
    assert apart == []


def test_the_labs_scripts_are_imported_or_started_by_the_package():
    """make_model.py (torch, run with PYTHONPATH cleared), pd_proxy.py (a server process) and
    wire_copy.py are started by the package; the doors hand over to it."""
    # code only: string literals and import statements, never comments (issue 43 item 11: a name in a
    # comment matched too)
    import ast
    import io
    import tokenize

    names, imports = [], set()
    for path in glob.glob(os.path.join(PKG, "*.py")):
        src = open(path).read()
        names += [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.STRING]
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Import):
                imports.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imports.add(node.module)
    literals = " ".join(names)
    for script in ("make_model.py", "pd_proxy.py", "wire_copy.py", "pd_harness.py", "bundle.sh", "upstream_tests.py"):
        assert script in literals, script


def test_the_report_is_a_room_and_its_old_script_a_door():
    """Issue 42 item 2: report.py lies in the package (it imports results, below it: no sys.path edit, no
    circle); experiments/report.py, which operators and experiments/README.md call, only hands over to it."""
    assert os.path.isfile(os.path.join(PKG, "report.py"))
    src = open(os.path.join(EXP, "report.py")).read()
    froms = [n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)]
    assert froms == ["pdtools.report"], froms
    code = [line for line in src.split('"""')[-1].splitlines() if line.strip() and not line.startswith("#")]
    assert len(code) <= 8, code


def test_the_package_exports_nothing_and_its_users_import_from_the_defining_module():
    """Issue 42 item 2: pdtools/__init__.py re-exports no name (its doors, __main__ and experiments/report.py,
    import cli and report themselves); scripts and tests import ``from pdtools.<module> import name`` or
    ``from pdtools import <module>``, never a name through the package."""
    body = ast.parse(open(os.path.join(PKG, "__init__.py")).read()).body
    assert [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))] == []
    modules = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(PKG, "*.py"))}
    users = [p for p in glob.glob(os.path.join(EXP, "**", "*.py"), recursive=True) if "results" not in p] + \
        glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
    bad = []
    for path in users:
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.module == "pdtools" and not node.level:
                bad += ["%s: %s" % (os.path.relpath(path, ROOT), a.name) for a in node.names if a.name not in modules]
            elif isinstance(node, ast.Import) and any(a.name == "pdtools" for a in node.names):
                bad.append("%s: import pdtools" % os.path.relpath(path, ROOT))
    assert bad == []
