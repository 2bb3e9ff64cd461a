"""The results .md files are renderings: experiments/report.py renders each from the .json beside it
(the record), and the README and docs link the renderings.  A figure edited into a rendering, or a
rendering left behind when the renderer changes, makes it say what its .json does not: each is
rendered again here and compared byte for byte.  A rendering is a results .md beside a bench results
.json (one with "cells", report.py's input); the other .md files are notes written by hand (an
equivalence run's account, the device log), which the renderer's heading must not open."""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "experiments", "results")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools import archive, report  # noqa: E402

#: renderings made with ``--wire FILE`` (the timed GPU0 -> GPU1 copy printed next to the xfer times)
WIRE = {"2026-11-23-0.26.0-2xH200.md": "2026-11-23-wire-2xH200.json"}
HEADING = "## P/D TTFT: "


def bench_json(name):
    """The bench results .json beside the results .md ``name`` (report.py's input: it has "cells"), or None."""
    path = os.path.join(RESULTS, name[:-3] + ".json")
    if not archive.exists(path):  # X.json, or X.json.xz
        return None
    doc = archive.load_json(path)
    return path if isinstance(doc, dict) and "cells" in doc else None


def renderings():
    return sorted(n for n in os.listdir(RESULTS) if n.endswith(".md") and bench_json(n))


def render(name):
    """What report.py writes for the rendering ``name`` (report.main's markdown, without the plot)."""
    doc = archive.load_json(os.path.join(RESULTS, name[:-3] + ".json"))
    wire = None
    if name in WIRE:
        wire = archive.load_json(os.path.join(RESULTS, WIRE[name]))
    return report.markdown(doc, wire)


@pytest.mark.parametrize("name", renderings())
def test_the_rendering_is_what_report_py_renders_from_its_json(name):
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        have = f.read()
    want = render(name)
    if have != want:
        diff = [line for line in __import__("difflib").unified_diff(
            have.splitlines(), want.splitlines(), "results/" + name, "report.py's rendering", lineterm="", n=0)]
        pytest.fail("experiments/results/%s is not what report.py renders from its .json (render it again: python3 "
                    "experiments/report.py experiments/results/%s --md experiments/results/%s --no-plot%s):\n%s"
                    % (name, name[:-3] + ".json", name, " --wire experiments/results/" + WIRE[name]
                       if name in WIRE else "", "\n".join(diff[:40])))


def test_every_linked_results_md_exists_and_only_renderings_wear_the_renderers_heading():
    docs = ["README.md"] + ["docs/" + n for n in sorted(os.listdir(os.path.join(ROOT, "docs"))) if n.endswith(".md")]
    linked = set()
    for doc in docs:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            linked |= set(re.findall(r"results/([\w.,+-]+\.md)\b", f.read()))
    rendered = set(renderings())
    assert linked & rendered, "no rendering linked"
    assert all(archive.exists(os.path.join(RESULTS, n)) for n in linked | set(WIRE.values())), sorted(linked)
    assert set(WIRE) <= rendered, sorted(set(WIRE) - rendered)
    # a note that opens with the renderer's heading would be a rendering whose .json is missing: unchecked
    for name in sorted(n for n in os.listdir(RESULTS) if n.endswith(".md")):
        with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
            assert f.readline().startswith(HEADING) == (name in rendered), name
