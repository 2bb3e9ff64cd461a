#!/usr/bin/env python3
"""Render experiments/results/compat-matrix.json as the README's support table.

    python3 tests/compat/render_table.py [--check]

Replaces the text between ``<!-- matrix:start -->`` and ``<!-- matrix:end -->`` in
README.md.  ``--check`` exits 1 when the README is not what the matrix says (a test runs it).
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MATRIX = os.path.join(ROOT, "experiments", "results", "compat-matrix.json")
GPU = os.path.join(ROOT, "experiments", "results", "gpu-proven.json")
README = os.path.join(ROOT, "README.md")
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"


def table(matrix, gpu=None):
    gpu = gpu or {}
    lines = ["| vLLM | mechanism | status | descriptors per block, stock → xlkv | NIXL descriptors moved, stock → "
             "xlkv: 8 blocks descending / 6 interleaved / 4 after a prefix hit | transfer verified | GPU | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for r in matrix["rows"]:
        s, x = r.get("descriptors_per_block_stock"), r.get("descriptors_per_block_xlkv")
        desc = "%s → %s" % (s, x) if s is not None or x is not None else "—"
        m = r.get("merged_descriptors") or {}
        merged = " / ".join("%s → %s" % (m[c]["stock"], m[c]["xlkv"]) for c in ("reversed", "interleaved", "shared")
                            if c in m) or "—"
        g = gpu.get(r["vllm"], {}).get("gpu") or ("CPU only" if r["status"] == "pass" else "—")
        lines.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["vllm"], r["mechanism"], r["status"], desc, merged, "yes" if r.get("transfer_verified") else "no", g,
            (r.get("notes") or "").replace("|", "/")))
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
                 "Produced by `%s`. GPU column: `experiments/results/gpu-proven.json`, which names the result "
                 "files." % matrix.get("command", "tests/compat/run_matrix.py"))
    return "\n".join(lines)


def render(readme_text, matrix, gpu=None):
    head, rest = readme_text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + "\n" + table(matrix, gpu) + "\n" + END + tail


def main():
    matrix = json.load(open(MATRIX))
    gpu = {k: v for k, v in json.load(open(GPU)).items() if not k.startswith("_")}
    text = open(README).read()
    new = render(text, matrix, gpu)
    if "--check" in sys.argv:
        if new != text:
            print("README.md support table is out of date: run python3 tests/compat/render_table.py")
            return 1
        return 0
    with open(README, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
