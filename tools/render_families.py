#!/usr/bin/env python3
"""Render experiments/results/families.json as the model-family table of docs/support-matrix.md.

    python3 tools/render_families.py [--check]

Every cell of the table is read from a results file: a row of families.json names the file and,
for each column, the JSON path of the value in it (``runs.mla.xlkv.registered.descs_per_block_id``),
so no number is typed twice.  A path that the file does not have renders as "not run"; a file
that does not exist is an error.  Replaces the text between ``<!-- families:start -->`` and
``<!-- families:end -->``; ``--check`` exits 1 when the document is not what the files say (a
test runs it).
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INDEX = os.path.join(ROOT, "experiments", "results", "families.json")
DOC = os.path.join(ROOT, "docs", "support-matrix.md")
START, END = "<!-- families:start -->", "<!-- families:end -->"
COLUMNS = ("stock", "best", "xlkv")


def resolve(data, path):
    """The value at a dotted path of a JSON document, or None where it has none."""
    for key in path.split("."):
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        else:
            return None
    return data


def _number(value):
    if value is None:
        return "not run"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def cells(row):
    """The row's rendered cells: (values by column, verdict of its checks: bytes or equivalence)."""
    path = os.path.join(ROOT, row["file"])
    with open(path) as f:  # a missing file is an error, never "not run"
        data = json.load(f)
    values = {c: _number(resolve(data, row[c])) if row.get(c) else "—" for c in COLUMNS}
    checks = [resolve(data, p) for p in row.get("bytes", [])]
    if not checks or any(c is None for c in checks):
        verdict = "not run"
    else:
        verdict = "yes" if all(c is True for c in checks) else "NO"
    return values, verdict


def table():
    index = json.load(open(INDEX))
    lines = ["| family | shape | vLLM | where | descriptors per %s: stock | vLLM's best setting | xlkv | verified "
             "| results |" % "block (id)",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in index["rows"]:
        values, verdict = cells(row)
        best = values["best"] if not row.get("best_setting") else "%s (%s)" % (values["best"], row["best_setting"])
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | [%s](%s) |" % (
            row["family"], row["shape"], row["vllm"], row["where"], values["stock"], best, values["xlkv"], verdict,
            os.path.basename(row["file"]), os.path.relpath(os.path.join(ROOT, row["file"]), os.path.dirname(DOC))))
    return "\n".join(lines)


#: the ordering table: block-order cases and the runs of stock_layout_order.py
ORDER_START, ORDER_END = "<!-- ordering:start -->", "<!-- ordering:end -->"
ORDER_CASES = (("reversed", "8 blocks descending"), ("interleaved", "6 interleaved"),
               ("shared", "4 after a prefix hit"))
ORDER_RUNS = ("stock", "keep_order", "ordered")


def ordering_table():
    """One row per release: per case, NIXL descriptors moved stock → XLKV_COALESCE=false → ordered."""
    index = json.load(open(INDEX))
    lines = ["| vLLM | layout kept (regions) | %s: stock → flag, `XLKV_COALESCE=false` → flag | bytes verified | results |"
             % " / ".join(label for _, label in ORDER_CASES), "|---|---|---|---|---|"]
    for row in index.get("ordering", []):
        with open(os.path.join(ROOT, row["file"])) as f:
            data = json.load(f)
        moved = " / ".join(" → ".join(_number(resolve(data, "runs.%s.cases.%s.nixl_descs" % (run, case)))
                                      for run in ORDER_RUNS) for case, _ in ORDER_CASES)
        checks = [resolve(data, "runs.%s.transfer_verified" % run) for run in ORDER_RUNS]
        verdict = "not run" if None in checks else ("yes" if all(c is True for c in checks) else "NO")
        kept = "%s (%s)" % (resolve(data, "runs.ordered.kv_layout"), _number(resolve(data, "runs.ordered.num_regions")))
        lines.append("| %s | %s | %s | %s | [%s](%s) |" % (
            row["vllm"], kept, moved, verdict, os.path.basename(row["file"]),
            os.path.relpath(os.path.join(ROOT, row["file"]), os.path.dirname(DOC))))
    return "\n".join(lines)


def _between(text, start, end, body):
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return head + start + "\n" + body + "\n" + end + tail


def render(text):
    text = _between(text, START, END, table())
    return _between(text, ORDER_START, ORDER_END, ordering_table()) if ORDER_START in text else text


def main(argv):
    text = open(DOC).read()
    new = render(text)
    if "--check" in argv:
        if new != text:
            print("docs/support-matrix.md's family or ordering table is not what the results files say: run "
                  "python3 tools/render_families.py")
            return 1
        return 0
    open(DOC, "w").write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
