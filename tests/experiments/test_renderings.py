"""The results .md files are renderings: experiments/report.py renders each from the .json beside it
(the record), and the README and docs link the renderings.  A figure edited into a rendering, or a
rendering left behind when the renderer changes, makes it say what its .json does not: each is
rendered again here and compared byte for byte.  Every results .md the README or a doc links is
either such a rendering or a note written by hand (NOTES)."""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "experiments", "results")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools import report  # noqa: E402

#: renderings made with ``--wire FILE`` (the timed GPU0 -> GPU1 copy printed next to the xfer times)
WIRE = {"2026-11-23-0.26.0-2xH200.md": "2026-11-23-wire-2xH200.json"}
#: results .md files written by hand, not rendered from a .json
NOTES = {"README.md", "device-log.md", "2026-11-27f-seed-first-token-reading.md"}
HEADING = "## P/D TTFT: "


def renderings():
    return sorted(n for n in os.listdir(RESULTS) if n.endswith(".md") and n not in NOTES)


def render(name):
    """What report.py writes for the rendering ``name`` (report.main's markdown, without the plot)."""
    with open(os.path.join(RESULTS, name[:-3] + ".json")) as f:
        doc = report.json.load(f)
    wire = None
    if name in WIRE:
        with open(os.path.join(RESULTS, WIRE[name])) as f:
            wire = report.json.load(f)
    return report.markdown(doc, wire)


@pytest.mark.parametrize("name", renderings())
def test_the_rendering_is_what_report_py_renders_from_its_json(name):
    assert os.path.exists(os.path.join(RESULTS, name[:-3] + ".json")), (
        "%s has no .json beside it: a note written by hand goes in NOTES" % name)
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


def test_every_linked_results_md_is_a_rendering_or_a_note():
    docs = ["README.md"] + ["docs/" + n for n in sorted(os.listdir(os.path.join(ROOT, "docs"))) if n.endswith(".md")]
    linked = set()
    for doc in docs:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            linked |= set(re.findall(r"results/([\w.,+-]+\.md)\b", f.read()))
    assert linked, "no results .md linked"
    rendered = set(renderings())
    assert linked <= rendered | NOTES, sorted(linked - rendered - NOTES)
    assert all(os.path.exists(os.path.join(RESULTS, n)) for n in NOTES | set(WIRE.values()) | linked)
    # every rendering has the renderer's heading; a note does not pretend to be one
    for name in rendered:
        with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
            assert f.readline().startswith(HEADING), name
