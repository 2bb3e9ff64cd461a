"""Every figure of docs/measurements.md, docs/deploy.md and README.md's prose comes from a file
(experiments/results/, a log line kept there, or the source a figure is about), or goes.

The claims (a template and a function of the files each) and their check live in tools/docfigures.py, which also
writes the figures into the docs (``python tools/docfigures.py --write``); here its ``--check`` runs on this checkout,
and both run on copies with a figure or a result changed. Pure file reads, no vLLM."""

import json
import os
import re
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import docfigures  # noqa: E402


@pytest.fixture(autouse=True)
def _this_checkout():
    """Every test starts and ends reading this checkout (a test may point the tool at a copy)."""
    docfigures.set_root(ROOT)
    yield
    docfigures.set_root(ROOT)


def test_the_docs_are_their_files():
    """`python tools/docfigures.py --check`: every claim, filled from its files, is word for word in its doc, and every
    number of the docs lies in a claim or an exempt span."""
    problems = docfigures.check(ROOT)
    assert problems == [], "the docs differ from their files (python tools/docfigures.py --write):\n" + "\n".join(
        problems)
    assert sum(len(c) for c in docfigures.CLAIMS.values()) >= 170  # what the claims were when they moved to tools/


def tree(tmp_path, results_copied=()):
    """A tree at tmp_path that the tool reads as this checkout: the docs copied, ``results_copied`` (files of
    experiments/results/) copied, everything else a link to this checkout's."""
    root = tmp_path / "tree"
    for top in (root, root / "experiments", root / "experiments" / "results"):
        top.mkdir()
        src = os.path.join(ROOT, os.path.relpath(top, root))
        for name in os.listdir(src):
            rel = os.path.relpath(top / name, root)
            if rel in ("docs", "experiments", os.path.join("experiments", "results")):
                continue
            if rel == "README.md" or name in results_copied:
                shutil.copy(os.path.join(src, name), top / name)
            else:
                (top / name).symlink_to(os.path.join(src, name))
    shutil.copytree(os.path.join(ROOT, "docs"), root / "docs")
    return root


def docs_of(root):
    return {doc: (root / os.path.join(*path)).read_bytes() for doc, path in docfigures.DOCS.items()}


@pytest.mark.parametrize("doc,old,new", [("measurements.md", "(**1.70×**)", "(**1.71×**)"),
                                         ("measurements.md", "max |Δlogprob| 0.41 and 0.30", "max |Δlogprob| 0.42 and 0.30"),
                                         ("deploy.md", "link down after 77 KB", "link down after 78 KB"),
                                         ("README.md", "(15.4 vs 14.8 ms", "(15.4 vs 14.3 ms")])
def test_a_changed_figure_is_seen(tmp_path, doc, old, new):
    """Planted in a copy of the doc: one figure changed. --check names the claim's span (the doc's words against the
    files') and the changed number as backed by no claim, and exits 1; --write puts the files' figure back."""
    root = tree(tmp_path)
    path = root / os.path.join(*docfigures.DOCS[doc])
    raw = path.read_text(encoding="utf-8")
    text = docfigures.normalize(raw, doc)[0]
    assert text.count(old) == 1, old
    # the doc wraps lines anywhere: plant in the raw text, whitespace as it stands there
    m = re.search(r"\s+".join(map(re.escape, old.split(" "))), raw)
    seps = re.findall(r"\s+", m.group())
    planted = raw[:m.start()] + "".join(w + s for w, s in zip(new.split(" "), seps + [""])) + raw[m.end():]
    path.write_text(planted, encoding="utf-8")
    problems = docfigures.check(root)
    differs = [p for p in problems if "differs from its files" in p]
    assert len(differs) == 1 and new in " ".join(differs[0].split("\n")[1].split()), problems
    [number] = [b for a, b in zip(re.findall(r"\d+(?:\.\d+)?", old), re.findall(r"\d+(?:\.\d+)?", new)) if a != b]
    assert any("no claim covers %r" % number in p for p in problems), (number, problems)
    assert docfigures.main(["--check", "--root", str(root)]) == 1
    changed, left = docfigures.write(root)
    assert changed == ["/".join(docfigures.DOCS[doc])] and left == [], (changed, left)
    assert path.read_text(encoding="utf-8") == raw


def test_write_leaves_the_docs_as_they_are(tmp_path):
    """--write on an unchanged tree (a copy): the docs byte for byte as they were, nothing left to report."""
    root = tree(tmp_path)
    before = docs_of(root)
    assert docfigures.main(["--write", "--root", str(root)]) == 0
    assert docs_of(root) == before


def test_write_fills_a_changed_result(tmp_path):
    """Planted in a copy of a results file: the 0.21.0 64 × 10240 shim cell's mean TTFT 2546 -> 2400 ms. --check names
    the figures; --write rewrites them (the cell, its ratio to stock, README's opening gain), and the docs then check
    clean."""
    name = "2026-11-22-0.21.0-2xH200.json"
    root = tree(tmp_path, results_copied=(name,))
    path = root / "experiments" / "results" / name
    data = json.loads(path.read_text())
    [shim] = [c for c in data["cells"] if (c["config"], c["num_prompts"], c["input_len"]) == ("shim", 64, 10240)]
    stock = [c for c in data["cells"] if (c["config"], c["num_prompts"], c["input_len"]) == ("stock", 64, 10240)][0]
    assert "%.0f" % shim["mean_ttft_ms_mean"] == "2546"
    shim["mean_ttft_ms_mean"] = 2400.0
    path.write_text(json.dumps(data))
    ratio = "%.2f×" % (stock["mean_ttft_ms_mean"] / 2400.0)
    assert ratio == "1.80×"
    before = docs_of(root)
    problems = docfigures.check(root)
    assert any("differs from its files" in p and "(**1.80×**)" in p for p in problems), problems
    changed, left = docfigures.write(root)
    assert left == [], left
    assert sorted(changed) == ["README.md", "docs/measurements.md"], changed
    measurements = docfigures.doc_text("measurements.md")
    assert "shim 2400 ± 136 ms (**1.80×**)" in measurements
    assert "2546 ± 136" not in measurements
    assert "mean TTFT 1.28–1.80× lower than stock" in docfigures.doc_text("README.md")
    assert docs_of(root)["deploy.md"] == before["deploy.md"]
