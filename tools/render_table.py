#!/usr/bin/env python3
"""Render experiments/results/compat-matrix.json as docs/support-matrix.md's support table (and
README's short one, where README has the markers: it has none now).

    python3 tools/render_table.py [--check]

Replaces the text between ``<!-- matrix:start -->`` and ``<!-- matrix:end -->`` in
README.md (short cells: ``short_table``) and in docs/support-matrix.md (every column, the notes
and the provenance: ``table``).  ``--check`` exits 1 when either file is not what the matrix
says (a test runs it).
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRIX = os.path.join(ROOT, "experiments", "results", "compat-matrix.json")
GPU = os.path.join(ROOT, "experiments", "results", "gpu-proven.json")
README = os.path.join(ROOT, "README.md")
DOC = os.path.join(ROOT, "docs", "support-matrix.md")
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"


ORDER = ("reversed", "interleaved", "shared")


def merged_cell(m):
    """'stock → xlkv' per block-order case; 'stock → off → xlkv' where the run recorded the
    count with the ordering off (XLKV_COALESCE=false)."""
    cells = []
    for c in ORDER:
        if c not in m:
            continue
        if m[c].get("xlkv_keep_order") is not None:
            cells.append("%s → %s → %s" % (m[c]["stock"], m[c]["xlkv_keep_order"], m[c]["xlkv"]))
        else:
            cells.append("%s → %s" % (m[c]["stock"], m[c]["xlkv"]))
    return " / ".join(cells) or "—"


def push_cell(p):
    if p is None:
        return "not run"
    if not p.get("available"):
        return "no push connector"
    if not p.get("as_expected"):
        return "FAILED"
    m = p.get("merged_descriptors") or {}
    fails = sorted(p.get("vllm_failures") or {})
    head = "exact" if not fails else "exact except %s, where stock vLLM's push writes other blocks too" % (
        ", ".join(fails))
    return "%s; %s" % (head, " / ".join("%s → %s" % (m[c]["stock"], m[c]["xlkv"]) for c in ORDER if c in m))


def table(matrix, gpu=None):
    gpu = gpu or {}
    lines = ["| vLLM | mechanism | status | descriptors per block, stock → xlkv | NIXL descriptors moved, stock → "
             "xlkv (stock → ordering off → xlkv where measured): 8 blocks descending / 6 interleaved / 4 after a "
             "prefix hit | push connector (P WRITEs), stock → xlkv, same cases | transfer verified | GPU | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in matrix["rows"]:
        s, x = r.get("descriptors_per_block_stock"), r.get("descriptors_per_block_xlkv")
        desc = "%s → %s" % (s, x) if s is not None or x is not None else "—"
        merged = merged_cell(r.get("merged_descriptors") or {})
        push = push_cell(r.get("push")) if r["status"] != "unsupported" else "—"
        g = gpu.get(r["vllm"], {}).get("gpu") or ("CPU only" if r["status"] == "pass" else "—")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["vllm"], r["mechanism"], r["status"], desc, merged, push, "yes" if r.get("transfer_verified") else "no",
            g, (r.get("notes") or "").replace("|", "/")))
    off = [r["vllm"] for r in matrix["rows"]
           if any((r.get("merged_descriptors") or {}).get(c, {}).get("xlkv_keep_order") is not None for c in ORDER)]
    pushed = [r["vllm"] for r in matrix["rows"] if (r.get("push") or {}).get("available")]
    lines.append("")
    lines.append("Descriptors are for the harness model (4 layers: stock is one per layer and per K/V up to "
                 "0.25, one per layer from 0.26); a Qwen3-0.6B block costs 56 (≤0.25) or 28 descriptors stock. "
                 "Safety cases (run_matrix.py, ENABLE_XLKV on both sides): NixlConnector in a MultiConnector on one "
                 "side and plain on the other; a MultiConnector with a child that takes no cross-layer blocks; a "
                 "16-token kernel block under 32-token blocks; tensors with 10 blocks more than the budget; and, in rows "
                 "that say 5/5, prefill TP 1 -> decode TP 2 (exact where xlkv allows it, refused where it does not). "
                 "NIXL descriptors moved: NIXL's own count after its merge (what vLLM's KV metrics print) for the "
                 "harness's block orders of a loaded server, bytes compared in each; xlkv lists the pairs in "
                 "ascending local order (patches/transfer_order.py). "
                 "With the ordering off (`XLKV_COALESCE=false`, vLLM's order) the count was measured in %s; "
                 "rows with two numbers per case were not run with it. "
                 "Push connector (vLLM's `NixlPushConnector`, `pd_harness.py --transfer push`): run in %s; "
                 "'not run' rows predate it. "
                 "Produced by `%s`. GPU column: `experiments/results/gpu-proven.json`, which names the result "
                 "files and the fields of each that back its words." % (
                     ", ".join(off) or "no row", ", ".join(pushed) or "no row",
                     matrix.get("command", "tools/run_matrix.py")))
    return "\n".join(lines)


# the README's mechanism cell: the part before the detail (the full name is in the docs table)
SHORT_MECHANISM = (("none", "—"), ("backport", "backport"), ("native opt-in + V1", "native opt-in + V1 runner"),
                   ("native opt-in", "native opt-in"), ("block-outermost", "BLNHC layout"))


def short_mechanism(m):
    return next((s for k, s in SHORT_MECHANISM if (m or "").startswith(k)), m or "—")


def short_gpu(text):
    """'equivalence PASS, TTFT (1×H200, 2×H200)' from the GPU column's words; '' for none."""
    if not text:
        return ""
    what = [w for w, key in (("equivalence PASS", "equivalence PASS"), ("TTFT", "TTFT")) if key in text]
    kinds = sorted(set(re.findall(r"\d+×H[12]00", text)))
    return "%s (%s)" % (", ".join(what) or "see details", ", ".join(kinds)) if kinds else ", ".join(what)


def short_table(matrix, gpu=None):
    """The README's table: one short cell per column; notes and provenance are in docs/support-matrix.md."""
    gpu = gpu or {}
    lines = ["| vLLM | mechanism | status | descriptors per block, stock → xlkv | NIXL descriptors moved, stock → "
             "xlkv: 8 descending / 6 interleaved / 4 after a prefix hit | push connector | bytes verified | GPU |",
             "|---|---|---|---|---|---|---|---|"]
    for r in matrix["rows"]:
        s, x = r.get("descriptors_per_block_stock"), r.get("descriptors_per_block_xlkv")
        desc = "%s → %s" % (s, x) if s is not None or x is not None else "—"
        merged = " / ".join("%s → %s" % (c["stock"], c["xlkv"]) for c in
                            [(r.get("merged_descriptors") or {}).get(k) for k in ("reversed", "interleaved", "shared")]
                            if c) or "—"
        p = r.get("push")  # the counts are in the docs table
        push = ("—" if r["status"] == "unsupported" else "not run" if p is None else
                "no push connector" if not p.get("available") else "exact" if p.get("as_expected") else "FAILED")
        g = short_gpu(gpu.get(r["vllm"], {}).get("gpu")) or ("CPU only" if r["status"] == "pass" else "—")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["vllm"], short_mechanism(r["mechanism"]), r["status"], desc, merged, push,
            "yes" if r.get("transfer_verified") else "no", g))
    lines.append("")
    lines.append("Real vLLM of each release + real NIXL on CPU, a 4-layer harness model (a Qwen3-0.6B block "
                 "costs 56 descriptors stock up to 0.25, 28 from 0.26). Every column in full, the safety cases, "
                 "the notes and how the table was produced: [docs/support-matrix.md](docs/support-matrix.md).")
    return "\n".join(lines)


def render(readme_text, matrix, gpu=None, make=None):
    head, rest = readme_text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + "\n" + (make or table)(matrix, gpu) + "\n" + END + tail


def main():
    matrix = json.load(open(MATRIX))
    gpu = {k: v for k, v in json.load(open(GPU)).items() if not k.startswith("_")}
    rc = 0
    for path, make in ((README, short_table), (DOC, table)):
        text = open(path).read()
        if START not in text:
            continue  # README dropped its short table (the full table is in docs/support-matrix.md)
        new = render(text, matrix, gpu, make)
        if "--check" in sys.argv:
            if new != text:
                print("%s support table is out of date: run python3 tools/render_table.py"
                      % os.path.relpath(path, ROOT))
                rc = 1
            continue
        with open(path, "w") as f:
            f.write(new)
    return rc


if __name__ == "__main__":
    sys.exit(main())
