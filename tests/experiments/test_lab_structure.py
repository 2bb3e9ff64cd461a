"""The lab's house: experiments/pdtools is one package whose rooms are tied by imports,
on floors that import only downward (no circle, nothing that runs back up), with the jobs reached
from the one entry point; the lab's scripts outside it are imported or started by it.  The
rooms talk in imports and arguments: none writes the environment (the door reads it
once, settings.Settings) or edits sys.path."""

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
    "settings": 0, "client": 0, "prompts": 0, "vllminfo": 0, "kvmetrics": 0, "handoff": 0, "archive": 0, "dynamo": 0,
    "results": 1, "equivalence": 1, "configs": 1, "cpuchecks": 1,
    "runs": 2, "pair": 2, "report": 2,
    "job_equivalence": 3, "job_bench": 3, "job_upstream": 3,
    "job_cell": 4, "job_main": 4,
    "cli": 5,
    "__init__": 6, "__main__": 6,
}


def _deps(source):
    """The package's modules ``source`` imports: relative imports (``from . import x``, ``from .x import y``)
    and absolute ones (``import pdtools.x``, ``from pdtools.x import y``, ``from pdtools import x``)."""
    deps = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if node.level == 0 and parts[0] == "pdtools":
                parts = parts[1:]
            elif node.level != 1:
                continue
            deps.update([parts[0]] if parts and parts[0] else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            deps.update(a.name.split(".")[1] for a in node.names if a.name.startswith("pdtools."))
    return deps


def _imports():
    """module -> the package's modules it imports (the jobs are plain imports of cli)."""
    return {os.path.basename(path)[:-3]: _deps(open(path).read())
            for path in sorted(glob.glob(os.path.join(PKG, "*.py")))}


def test_the_import_reader_sees_relative_and_absolute_imports():
    assert _deps("from . import a, b\nfrom .c import x\nfrom pdtools.d import y\nfrom pdtools import e\n"
                 "import pdtools.f\nimport pdtools.g.h\nimport os\nfrom os import path\n") == set("abcdefg")


def test_every_room_has_a_floor_and_imports_only_downward():
    graph = _imports()
    assert set(graph) == set(FLOORS), "give every module of pdtools a floor: %s" % (set(graph) ^ set(FLOORS))
    unknown = ["%s imports %s" % (m, d) for m, deps in graph.items() for d in deps if d not in FLOORS]
    assert unknown == []
    up = ["%s (%d) imports %s (%d)" % (m, FLOORS[m], d, FLOORS[d]) for m, deps in graph.items() for d in deps
          if FLOORS[d] >= FLOORS[m]]
    assert up == []
    assert graph["__main__"] == {"cli"}      # both its ways in: the folder run's absolute import, -m's relative one


def test_no_room_stands_apart():
    graph = _imports()
    used = set().union(*graph.values())
    apart = sorted(m for m in graph if m not in used and m not in ("__init__", "__main__"))
    assert apart == []


def test_the_labs_scripts_are_imported_or_started_by_the_package():
    """make_model.py (torch, run with PYTHONPATH cleared), pd_proxy.py (a server process) and
    wire_copy.py are started by the package; the doors hand over to it."""
    # code only: string literals and import statements, never comments (a name in a
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
    """report.py lies in the package (it imports results, below it: no sys.path edit, no
    circle); experiments/report.py, which operators and experiments/README.md call, only hands over to it."""
    assert os.path.isfile(os.path.join(PKG, "report.py"))
    src = open(os.path.join(EXP, "report.py")).read()
    froms = [n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)]
    assert froms == ["pdtools.report"], froms
    code = [line for line in src.split('"""')[-1].splitlines() if line.strip() and not line.startswith("#")]
    assert len(code) <= 8, code


def test_the_package_exports_nothing_and_its_users_import_from_the_defining_module():
    """pdtools/__init__.py re-exports no name (its doors, __main__ and experiments/report.py,
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


#: rooms that may write the environment, and why (none: the door reads it once, children get env=)
ENV_WRITERS = {}
#: rooms that may edit sys.path, and why
PATH_EDITORS = {
    "__main__.py": "run as a folder (python3 experiments/pdtools), sys.path[0] is the package folder: the "
                   "package must be imported from its parent instead",
}
_MUTATORS = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__", "insert", "append",
             "extend", "remove"}


def _is(node, module, attr):
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) and \
        node.value.id == module


def _writes(source, module, attr):
    """Lines where ``source`` changes ``module.attr`` (os.environ, sys.path): item assignment or deletion,
    assignment to it or a slice of it, a mutating method; for os.environ also os.putenv/unsetenv and importing
    environ/putenv/unsetenv by name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else node.targets if isinstance(node, ast.Delete) else []
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets += t.elts
            elif _is(t, module, attr) or isinstance(t, ast.Subscript) and _is(t.value, module, attr):
                found.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _MUTATORS and _is(node.func.value, module, attr):
                found.append(node.lineno)
            if module == "os" and (_is(node.func, "os", "putenv") or _is(node.func, "os", "unsetenv")):
                found.append(node.lineno)
        if module == "os" and isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "putenv", "unsetenv") for a in node.names):
            found.append(node.lineno)
    return found


def test_the_scans_see_every_kind_of_write():
    planted = ("import os, sys\nos.environ['A'] = '1'\nos.environ.setdefault('B', '2')\nos.environ.update(C='3')\n"
               "os.environ.pop('D', None)\nos.putenv('E', '5')\ndel os.environ['F']\nos.environ.clear()\n"
               "from os import environ\nx = os.environ.get('G')\nenv = dict(os.environ, H='8')\n"
               "os.environ['I'], y = '1', 2\n")
    assert sorted(_writes(planted, "os", "environ")) == [2, 3, 4, 5, 6, 7, 8, 9, 12]
    planted = "import sys\nsys.path.insert(0, 'x')\nsys.path[:] = []\nsys.path.append('y')\nsys.path = ['z']\n" \
              "print(sys.path[0])\n"
    assert sorted(_writes(planted, "sys", "path")) == [2, 3, 4, 5]


def test_no_room_writes_the_environment():
    """No environment writes as messages between rooms; a child gets env= (settings.server_env,
    Pair.child_env)."""
    found = {os.path.basename(p): _writes(open(p).read(), "os", "environ") for p in glob.glob(os.path.join(PKG, "*.py"))}
    assert {f: lines for f, lines in found.items() if lines and f not in ENV_WRITERS} == {}


def test_the_environment_is_read_at_the_door_only():
    """os.environ appears in one place: Settings.read, which a door calls once; every room reads the Settings."""
    where = []
    for path in glob.glob(os.path.join(PKG, "*.py")):
        for node in ast.walk(ast.parse(open(path).read())):
            if _is(node, "os", "environ") or _is(node, "os", "getenv"):
                where.append(os.path.basename(path))
    assert where == ["settings.py"]
    doors = [os.path.basename(p) for p in glob.glob(os.path.join(PKG, "*.py")) for node in ast.walk(
        ast.parse(open(p).read())) if isinstance(node, ast.Call) and _is(node.func, "Settings", "read")]
    assert doors == ["cli.py"]


def test_no_room_edits_sys_path():
    """The rooms import each other, and what lies outside the package (the negative-control hook,
    upstream_tests.py, the checkout's xlkv_autopatch where the Python has none) by location; only the folder
    run's door fixes sys.path."""
    found = {os.path.basename(p): _writes(open(p).read(), "sys", "path") for p in glob.glob(os.path.join(PKG, "*.py"))}
    assert {f: lines for f, lines in found.items() if lines and f not in PATH_EDITORS} == {}
    assert all(found.get(f) for f in PATH_EDITORS), "an allowance no longer needed: %s" % PATH_EDITORS
