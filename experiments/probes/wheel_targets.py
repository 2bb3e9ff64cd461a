#!/usr/bin/env python3
"""Every patch target of the shim, checked in vLLM wheels without installing them (no torch, no GPU).

For each wheel (or unpacked site-packages folder) the release's patch groups
(``xlkv_autopatch.patches.all_groups()`` whose range contains it) are resolved *statically*: the
target module's source is parsed (ast), the owner class found (following ``X = Y`` aliases, a
``from ... import`` one level deep and base classes in the same or imported modules), and the
attribute must exist with the parameter names the PatchSpec declares.  What it cannot tell
(a property's getter, a class attribute's value, decorators applied at run time) the real tests
on installed releases do; this covers the releases no environment here has.

usage: python3 experiments/probes/wheel_targets.py [--json OUT] WHEEL_OR_DIR[=VERSION] ...
  (the version is read from the wheel's file name, or given after '=')
exit 1 if any target is missing or has other parameters.
"""

import argparse
import ast
import json
import os
import re
import sys
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from xlkv_autopatch.patches import all_groups  # noqa: E402
from xlkv_autopatch.versions import in_range  # noqa: E402


def reader(path):
    """mod -> source text or None, for a wheel or a folder holding the ``vllm`` package."""
    if path.endswith(".whl"):
        z = zipfile.ZipFile(path)
        names = set(z.namelist())

        def get(mod):
            rel = mod.replace(".", "/")
            for name in (rel + ".py", rel + "/__init__.py"):
                if name in names:
                    return z.read(name).decode()
            return None
        return get

    def get_dir(mod):
        rel = os.path.join(path, *mod.split("."))
        for name in (rel + ".py", os.path.join(rel, "__init__.py")):
            if os.path.exists(name):
                return open(name).read()
        return None
    return get_dir


def _imported(tree, module, name):
    """(module, name) that ``name`` is imported from in ``tree``, or None."""
    for n in tree.body:
        if isinstance(n, ast.ImportFrom):
            for a in n.names:
                if (a.asname or a.name) == name:
                    base = n.module or ""
                    if n.level:
                        parent = module.rsplit(".", n.level)[0]
                        base = parent + ("." + base if base else "")
                    return base, a.name
    return None


def find(get, module, owner, attr, depth=0):
    """(params or "present", None) when ``owner.attr`` (or module-level ``attr``) is found; (None, why)."""
    src = get(module)
    if src is None or depth > 8:
        return None, "no module %s" % module
    tree = ast.parse(src)
    if owner is None:
        for n in tree.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attr:
                return _params(n), None
        src_of = _imported(tree, module, attr)  # the shim rebinds the name where it is used
        if src_of:
            return find(get, src_of[0], None, src_of[1], depth + 1)
        return None, "%s has no function %s" % (module, attr)
    for n in tree.body:  # NixlConnector = NixlPullConnector
        if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                and n.targets[0].id == owner and isinstance(n.value, ast.Name)):
            owner = n.value.id
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
    if cls is None:
        src_of = _imported(tree, module, owner)
        if src_of:
            return find(get, src_of[0], src_of[1], attr, depth + 1)
        return None, "no class %s in %s" % (owner, module)
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == attr:
            return _params(n), None
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                return "present", None
    for b in cls.bases:
        name = b.id if isinstance(b, ast.Name) else getattr(b, "attr", None)
        if not name:
            continue
        got, _ = find(get, module, name, attr, depth + 1)
        if got is not None:
            return got, None
    return None, "%s.%s not found" % (owner, attr)


def _params(fn):
    out = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return out + (["..."] if fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs else [])


def matches(params, want):
    if params is None:
        return False
    if params == "present" or want is None:
        return params is not None
    want = list(want)
    if want and want[-1] == "...":
        return params[:len(want) - 1] == want[:-1]
    return [p for p in params if p != "..."] == want


def check(path, version):
    get = reader(path)
    rows = []
    for g in all_groups():
        if g.always or not in_range(version, g.vllm):
            continue
        for spec in g.patches:
            params, why = find(get, spec.module, spec.owner, spec.attr)
            rows.append({"vllm": version, "group": g.name, "patch": spec.name, "target": spec.target,
                         "ok": matches(params, spec.params), "found": params, "want": spec.params, "why": why})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("paths", nargs="+")
    a = ap.parse_args(argv)
    rows = []
    for item in a.paths:
        path, _, version = item.partition("=")
        if not version:
            m = re.search(r"vllm-(\d+\.\d+\.\d+)", os.path.basename(path))
            if not m:
                ap.error("%s: no version in the name; give PATH=VERSION" % path)
            version = m.group(1)
        rows += check(path, version)
    bad = [r for r in rows if not r["ok"]]
    for r in rows:
        print("%-7s %-14s %-40s %s" % (r["vllm"], r["group"], r["patch"], "ok" if r["ok"] else
                                        "MISSING/DIFFERENT: found %s, want %s (%s)" % (r["found"], r["want"], r["why"])))
    print("%d targets in %d releases: %d not as the shim expects" % (len(rows), len({r["vllm"] for r in rows}),
                                                                      len(bad)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "bad": len(bad)}, f, indent=1, default=list)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
