"""One name per release fact: every fact the package reads from a release row is a column of the release
table (xlkv_autopatch/releases.py), under the column's own name, in the patch targets' ``when`` and in
the code that asks the facts (wrappers, status, the catalogue).  A renamed or misspelled fact, or an
alias that translates one name into another, fails here rather than as an AttributeError on the one
release whose code path reads it.  String values compared with a column (``f.mechanism == "layout"``)
must be values the column takes."""

import ast
import os

from xlkv_autopatch import facts, releases

PKG = os.path.dirname(os.path.abspath(releases.__file__))

#: calls that return a release row or its facts (facts.current(), facts.facts_for(...), releases.row_for(...))
SOURCES = {"current", "facts_for", "row_for"}
#: parameters that hold a release row or its facts, by the names the package gives them
PARAMS = {"f", "row", "release"}
#: calls whose lambda argument receives a release row or facts (releases.runs, facts.span_of)
ROW_CALLS = {"runs", "span_of"}


def columns():
    return tuple(releases.Release.__dataclass_fields__)


def readable():
    """What a row or its facts answers: the columns, and the properties derived from a column's
    vocabulary (``home`` from ``nixl``, ``hash_params`` from ``hash``)."""
    props = {n for n in dir(releases.Release) if isinstance(getattr(releases.Release, n), property)}
    return set(columns()) | props


def _is_source(node):
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SOURCES


def _call_name(node):
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def fact_reads(tree):
    """(attribute, line, node) of every attribute read on a release row or its facts in ``tree``: on a
    SOURCES call, on a name assigned from one, on a PARAMS parameter, on a ROW_CALLS lambda's parameter."""
    row_lambdas = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and _call_name(n) in ROW_CALLS
                   for a in n.args if isinstance(a, ast.Lambda)}
    out = {}  # by node: a read inside a function is seen from the module too
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda))] + [tree]:
        bound = set()
        if not isinstance(fn, ast.Module):
            params = fn.args.args + fn.args.kwonlyargs
            bound |= {a.arg for a in params if a.arg in PARAMS or id(fn) in row_lambdas}
        body = list(ast.walk(fn))
        bound |= {t.id for n in body if isinstance(n, ast.Assign) and _is_source(n.value)
                  for t in n.targets if isinstance(t, ast.Name)}
        for n in body:
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and (
                    _is_source(n.value) or (isinstance(n.value, ast.Name) and n.value.id in bound)):
                out[id(n)] = (n.attr, n.lineno, n)
    return sorted(out.values(), key=lambda read: (read[1], read[2].col_offset))


def _modules():
    for folder, _, names in os.walk(PKG):
        for fname in sorted(names):
            if fname.endswith(".py") and fname != "releases.py":  # the table itself defines the names
                path = os.path.join(folder, fname)
                yield os.path.relpath(path, PKG), ast.parse(open(path).read())


def test_every_fact_read_is_a_release_table_column():
    known = readable()
    reads = [(where, attr, line) for where, tree in _modules() for attr, line, _ in fact_reads(tree)]
    assert len({attr for _, attr, _ in reads}) >= 10, reads  # the scan sees the wrappers' reads
    bad = [(where, line, attr) for where, attr, line in reads if attr not in known]
    assert bad == [], "not a column of xlkv_autopatch/releases.py's table: %s" % bad


def bad_comparisons(tree):
    """(line, column, value) of every ``row.COLUMN == "value"`` (or ``!=``) in ``tree`` whose value the
    column never takes."""
    taken = {c: {getattr(r, c) for r in releases.RELEASES} for c in columns()}
    reads = {id(node): attr for attr, _, node in fact_reads(tree) if attr in taken}
    bad = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare) and id(n.left) in reads:
            for op, right in zip(n.ops, n.comparators):
                if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(right, ast.Constant) \
                        and isinstance(right.value, str) and right.value not in taken[reads[id(n.left)]]:
                    bad.append((n.lineno, reads[id(n.left)], right.value))
    return bad


def test_values_compared_with_a_column_are_values_it_takes():
    """``f.mechanism == "layout"`` names a value of the column (a typo would be silently False)."""
    bad = [(where,) + b for where, tree in _modules() for b in bad_comparisons(tree)]
    assert bad == []


def test_every_when_names_a_column():
    """The patch targets' ``when`` keys are columns (test_structure also checks the values they take)."""
    from xlkv_autopatch import patches

    whens = {column for m in patches.MODULES for t in getattr(m, "TARGETS", ()) for column, _ in t.when}
    assert whens and whens <= set(columns()), whens - set(columns())


def test_the_facts_are_the_rows_columns_under_the_same_names():
    """facts.ReleaseFacts adds no name of its own: a new column is a fact without a second edit."""
    assert tuple(facts.ReleaseFacts.__dataclass_fields__) == columns()
    row, got = releases.RELEASES[-1], facts.facts_for(releases.RELEASES[-1].release + ".0")
    assert all(getattr(got, c) == getattr(row, c) for c in columns() if c != "release")
    assert got.release == releases.minor(row.release) + (0,)


def test_the_scan_sees_a_fact_read_under_another_name():
    tree = ast.parse("def w(instance):\n    f = facts.current()\n    return f.kv_cache_layouts or f.mechanism\n"
                     "def s(f):\n    return f.packed\n"
                     "x = releases.runs(lambda r: r.hs_hash)\n")
    assert [a for a, _, _ in fact_reads(tree)] == ["kv_cache_layouts", "mechanism", "packed", "hs_hash"]
    assert {a for a, _, _ in fact_reads(tree)} - readable() == {"kv_cache_layouts", "packed", "hs_hash"}
    bad = ast.parse("def w(f):\n    return f.mechanism == 'layouts' or f.mechanism != 'native'\n")
    assert bad_comparisons(bad) == [(2, "mechanism", "layouts")]
