"""A module of the shim whose docstring names a results file quotes that file's figures: each claim
below, filled from the file and rounded as the docstring rounds (half up to whole ms), must be in the
docstring word for word, and every millisecond figure of that docstring must lie inside a claim.
Pure file reads (the docstrings through ``ast``, no import of vLLM)."""

import ast
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "experiments", "results")
PACKAGE = os.path.join(ROOT, "xlkv_autopatch")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools import archive, report  # noqa: E402  (the handoff split: pdtools/report.py, tested in tests/experiments)


def load(name):
    return archive.load_json(os.path.join(RESULTS, name))  # NAME, else NAME.xz


def ms(x):
    """Whole milliseconds, rounded half up (27.53 is 28, 24.95 is 25)."""
    return "%d" % int(x + 0.5)


def ms_span(xs):
    return "%s-%s" % (ms(min(xs)), ms(max(xs)))


def sub(doc, config, length, conc, part):
    """The mean of a handoff sub-part (report.handoff_rows: P's and D's frontend ...) of one cell, in ms."""
    [row] = [r for r in report.handoff_rows(doc) if (r["config"], r["input_len"], r["max_concurrency"])
             == (config, length, conc)]
    return row["subparts"][part]["mean"]


def cell(doc, config, n, length):
    [c] = [c for c in doc["cells"] if (c["config"], c["num_prompts"], c["input_len"]) == (config, n, length)]
    return c


def detok_claim(name):
    """patches/incremental_detokenizer.py: what the whole-prompt priming cost P's answer and D's first token
    (the frontend sub-parts of the handoff split) without and with XLKV_DETOK_TAIL."""
    d = load(name)
    gpus, gpu = d["gpu"].split("x")
    reps = {cell(d, c, n, 10240)["reps"] for c in ("shim", "shim-detok") for n in (10, 64)}
    return (gpus, gpu, d["vllm_version"], 10240, name, reps.pop() if len(reps) == 1 else "?",
            ms(sub(d, "shim", 10240, 1, "p_frontend")), ms(sub(d, "shim", 10240, 1, "d_frontend")),
            ms_span([sub(d, "shim-detok", 10240, 1, p) for p in ("p_frontend", "d_frontend")]),
            ms(sub(d, "shim", 10240, 64, "d_frontend")), 64, ms(sub(d, "shim-detok", 10240, 64, "d_frontend")))


#: module (path under xlkv_autopatch/) -> [(template, function of the results file the docstring names)]
CLAIMS = {
    "patches/incremental_detokenizer.py": [
        ("On {} x {} with vLLM {} and {}-token prompts (experiments/results/{}, means of {} alternated repetitions) "
         "it was {} ms of P's answer and {} ms of D's first token at one request at a time ({} ms with the switch), "
         "and {} ms of D's first token at {} at a time ({} ms)", detok_claim),
    ],
}


def modules():
    for folder, _, files in os.walk(PACKAGE):
        for f in sorted(files):
            if f.endswith(".py"):
                yield os.path.relpath(os.path.join(folder, f), PACKAGE)


def docstring(module):
    with open(os.path.join(PACKAGE, module), encoding="utf-8") as f:
        return " ".join((ast.get_docstring(ast.parse(f.read())) or "").split())


def named_results(text):
    return re.findall(r"experiments/results/([\w.,-]+\.json)", text)


def claims_text(module, text):
    [name] = set(named_results(text))
    return [template.format(*fn(name)) for template, fn in CLAIMS[module]]


def test_every_docstring_that_names_a_results_file_has_its_claims():
    named = {m for m in modules() if named_results(docstring(m))}
    assert named == set(CLAIMS), "docstrings naming a results file: %s; claims here for: %s" % (
        sorted(named), sorted(CLAIMS))
    for m in named:
        assert len(set(named_results(docstring(m)))) == 1, (m, "names more than one results file: split its claims")
        assert all(archive.exists(os.path.join(RESULTS, n)) for n in named_results(docstring(m))), m


def uncovered(text, claims):
    """The millisecond figures of ``text`` ("25 ms", "2-3 ms") that lie in no claim."""
    spans = [(m.start(), m.end()) for c in claims for m in re.finditer(re.escape(c), text)]
    return ["%r in ...%s..." % (m.group(), text[max(0, m.start() - 60):m.end() + 10])
            for m in re.finditer(r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?ms\b", text)
            if not any(a <= m.start() and m.end() <= b for a, b in spans)]


@pytest.mark.parametrize("module", sorted(CLAIMS))
def test_the_docstring_quotes_its_results_file(module):
    text = docstring(module)
    for want in claims_text(module, text):
        assert want in text, "xlkv_autopatch/%s's docstring should say, as its results file does:\n  %s" % (
            module, want)
    assert uncovered(text, claims_text(module, text)) == []


def test_a_changed_figure_is_seen():
    """Planted in a docstring that says what its file says: one figure changed.  The claim no longer matches,
    and the changed figure is named as backed by no claim."""
    module = "patches/incremental_detokenizer.py"
    claims = claims_text(module, docstring(module))
    text = "Why " + " ".join(claims) + ". How ..."
    assert uncovered(text, claims) == []
    planted = text.replace("at a time (6 ms)", "at a time (7 ms)")
    assert planted != text and not all(c in planted for c in claims)
    assert [b.split(" in ")[0] for b in uncovered(planted, claims) if "(7 ms" in b] == ["'7 ms'"], \
        uncovered(planted, claims)
