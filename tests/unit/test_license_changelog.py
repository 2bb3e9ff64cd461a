"""LICENSE is the full Apache License 2.0 (vLLM's license, and setup.cfg's), and CHANGELOG.md's versions are
what git history shows: each section's first and last version are xlkv_autopatch/_version.py at the commits it
names, on the dates it names; the newest is the package's version; no version of the history is left out."""

import os
import re
import subprocess

import pytest

from xlkv_autopatch._version import __version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the nine sections of the Apache License 2.0's terms, in order
APACHE_SECTIONS = ["Definitions", "Grant of Copyright License", "Grant of Patent License", "Redistribution",
                   "Submission of Contributions", "Trademarks", "Disclaimer of Warranty", "Limitation of Liability",
                   "Accepting Warranty or Additional Liability"]
#: "## 0.9.0–0.9.3 (2026-11-27; 3ef8dc9..637258d)" or "## 0.4.0 (2026-11-25; ccabc01)"; the newest section may
#: name no commit while its version is not committed yet ("## 0.9.5 (2026-11-30)": a commit cannot name itself)
HEADER = re.compile(r"^## (\d+\.\d+\.\d+)(?:–(\d+\.\d+\.\d+))? \((\d{4}-\d\d-\d\d)(?:\.\.(\d{4}-\d\d-\d\d))?"
                    r"(?:; ([0-9a-f]{7,})(?:\.\.([0-9a-f]{7,}))?)?\)$", re.M)


def _read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def license_problems(text):
    words = " ".join(text.split())
    bad = []
    if not words.startswith("Apache License Version 2.0, January 2004 http://www.apache.org/licenses/"):
        bad.append("not the Apache License 2.0's heading")
    at = 0
    for n, title in enumerate(APACHE_SECTIONS, 1):
        i = words.find("%d. %s." % (n, title), at)
        if i < 0:
            bad.append("section %d (%s) missing or out of order" % (n, title))
        at = max(at, i)
    if "END OF TERMS AND CONDITIONS" not in words or "APPENDIX: How to apply the Apache License" not in words:
        bad.append("no end of terms or appendix")
    return bad


def test_license_is_the_full_apache_2_0_text():
    assert license_problems(_read("LICENSE")) == []
    assert re.search(r"^license = Apache-2.0$", _read("setup.cfg"), re.M)
    assert "[Apache-2.0](LICENSE)" in _read("README.md")


def test_the_license_check_sees_a_shortened_text():
    text = _read("LICENSE")
    cut = text[:text.index("8. Limitation of Liability.")]   # planted: the text stops after section 7
    assert "section 8 (Limitation of Liability) missing or out of order" in license_problems(cut)
    assert license_problems("Apache License 2.0, see https://www.apache.org/licenses/LICENSE-2.0\n")


def _git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=120)


def version_history():
    """[(commit, date, version)] of every commit that changed xlkv_autopatch/_version.py, oldest first."""
    r = _git("log", "--reverse", "--format=%h %ad", "--date=short", "--", "xlkv_autopatch/_version.py")
    if r.returncode != 0 or not r.stdout.strip():
        pytest.skip("no git history here")
    out = []
    for line in r.stdout.split("\n"):
        if line.strip():
            commit, date = line.split()
            text = _git("show", "%s:xlkv_autopatch/_version.py" % commit).stdout
            out.append((commit, date, re.search(r'__version__ = "([^"]+)"', text).group(1)))
    return out


def _v(s):
    return tuple(int(x) for x in s.split("."))


def changelog_problems(text, history):
    by_commit = {c: (d, v) for c, d, v in history}
    bad = []
    sections = HEADER.findall(text)
    if not sections:
        return ["no version section"]
    ranges = []
    for n, (first, last, date1, date2, c1, c2) in enumerate(sections):
        last, date2, c2 = last or first, date2 or date1, c2 or c1
        ranges.append((_v(first), _v(last)))
        if not c1:
            if n or last != first or first in {v for _, _, v in history}:
                bad.append("%s: no commit named (only the newest version, before its commit, may name none)" % first)
            continue
        for commit, version, date in ((c1, first, date1), (c2, last, date2)):
            hit = [k for k in by_commit if k.startswith(commit) or commit.startswith(k)]
            if len(hit) != 1:
                bad.append("%s: commit %s changed no version in git history" % (version, commit))
            elif by_commit[hit[0]] != (date, version):
                bad.append("%s (%s, %s): git history has %s on %s" % (version, commit, date, by_commit[hit[0]][1],
                                                                      by_commit[hit[0]][0]))
    if sections[0][1] or sections[0][0] != __version__:
        bad.append("the newest section is not the package's version %s alone" % __version__)
    if ranges != sorted(ranges, reverse=True):
        bad.append("sections not newest first")
    for _, _, version in history:
        if not any(a <= _v(version) <= b for a, b in ranges):
            bad.append("version %s of git history is in no section" % version)
    return bad


def test_the_changelog_is_what_git_history_shows():
    assert changelog_problems(_read("CHANGELOG.md"), version_history()) == []


def test_the_changelog_check_sees_an_invented_version_and_a_wrong_date():
    history, text = version_history(), _read("CHANGELOG.md")
    newest = HEADER.search(text).group(0)
    invented = text.replace(newest, "## 1.0.0 (2026-11-30; %s)" % HEADER.search(text).group(5), 1)
    assert any("1.0.0" in p for p in changelog_problems(invented, history)), changelog_problems(invented, history)
    redated = text.replace("## 0.4.0 (2026-11-25;", "## 0.4.0 (2026-11-24;", 1)
    assert redated != text and any("0.4.0" in p for p in changelog_problems(redated, history))
    uncommitted = text.replace("## 0.4.0 (2026-11-25; ccabc01)", "## 0.4.0 (2026-11-25)", 1)
    assert any("0.4.0: no commit named" in p for p in changelog_problems(uncommitted, history))
    dropped = text.replace("## 0.4.0 ", "## 0.4.0-gone ", 1)   # its header no longer parses: 0.4.0 in no section
    assert "version 0.4.0 of git history is in no section" in changelog_problems(dropped, history)
