#!/usr/bin/env python3
"""Render the heterogeneous-TP results (experiments/results/*-hetero-tp-cpu-<release>.json, written by
experiments/cpu/hetero_tp.py) as the table of docs/support-matrix.md.

    python3 tools/render_hetero_tp.py [--check]

One row per release and pairing: the model, prefill TP -> decode TP, the prefill ranks each decode
rank reads, then for stock and for xlkv whether every case's bytes matched on every decode rank, the
regions decode registered, and the descriptors per block per remote rank (every case and decode rank;
a range where they differ).  Every cell is read from the files.  Replaces the text between
``<!-- hetero-tp:start -->`` and ``<!-- hetero-tp:end -->``; ``--check`` exits 1 when the document is
not what the files say (tests/unit/test_docs.py runs it).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # the package's family names (a checkout run: python3 tools/render_hetero_tp.py)
    sys.path.append(ROOT)
from xlkv_autopatch.families import canonical  # noqa: E402  (files before 0.8.3 spell the hybrid "swa")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools import archive  # noqa: E402  (a results file kept as X.json.xz is read as X.json)

FILES = os.path.join(ROOT, "experiments", "results", "*-hetero-tp-cpu-*.json")
DOC = os.path.join(ROOT, "docs", "support-matrix.md")
START, END = "<!-- hetero-tp:start -->", "<!-- hetero-tp:end -->"
MODELS = {"dense": "dense, %s KV heads", "sliding-window": "gpt-oss-shaped sliding-window hybrid, 2 KV heads",
          "mla": "DeepSeek-V2-shaped MLA"}


def _release_key(path):
    return tuple(int(x) for x in path.rsplit("-", 1)[1][:-5].split("."))


def _cell(run):
    """'exact, 4 regions, 4' for one run (None: not run)."""
    if run is None:
        return "not run"
    if not run.get("transfer_verified"):
        text = " ".join(run.get("errors") or ["no bytes compared"])
        at = text.find("NIXL handshake refused: ")  # xlkv's own refusal, where there is one
        why = text[at + len("NIXL handshake refused: "):].split(". Fix:")[0] if at >= 0 else text
        return "**refused**: %s" % why[:200].replace("|", "/")
    per = sorted({v for c in run["cases"].values() for v in c.get("descriptors_per_block_per_remote_rank") or []
                  if v is not None})
    count = "%g" % per[0] if len(per) == 1 else "%g-%g" % (per[0], per[-1]) if per else "?"
    return "exact, %s region(s), %s" % (run.get("num_regions"), count)


def rows():
    out = []
    for path in sorted(archive.glob(FILES), key=_release_key):
        res = archive.load_json(path)
        pairings = []
        for name, run in res["runs"].items():
            key = name.split("_", 1)[1]
            if key not in pairings:
                pairings.append(key)
        for key in pairings:
            stock, xlkv = res["runs"].get("stock_" + key), res["runs"].get("xlkv_" + key)
            equal = res["runs"].get("equal_" + key)
            any_run = stock or xlkv or equal
            model = MODELS[canonical(any_run["family"])]
            model = model % (any_run.get("kv_heads"),) if "%s" in model else model
            backend = any_run.get("attn_backend") or "FLASH_ATTN"
            out.append("| %s | %s%s | %d → %d | %d | %s | %s | %s | [%s](../experiments/results/%s) |" % (
                res["vllm"], model, "" if backend == "FLASH_ATTN" else ", %s" % backend, any_run["prefill_tp"],
                any_run["decode_tp"], any_run["remote_ranks_per_decode_rank"], _cell(stock), _cell(xlkv),
                "–" if equal is None else _cell(equal), os.path.basename(path)[:-5],
                os.path.basename(archive.resolve(path))))
    return out


def render():
    head = ["| vLLM | model (4 layers) | prefill TP → decode TP | prefill ranks per decode rank | stock: bytes, D's "
            "regions, descriptors per block per remote rank | xlkv (`ENABLE_XLKV=true` on both) | xlkv with "
            "`XLKV_EQUAL_TP=true` | file |",
            "|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + rows())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(DOC) as f:
        text = f.read()
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    new = before + START + "\n" + render() + "\n" + END + after
    if "--check" in argv:
        return 0 if new == text else 1
    with open(DOC, "w") as f:
        f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
