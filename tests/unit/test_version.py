"""The version changes when the package changes (0.2.0 across 56 commits), so
``status`` (which prints it with the package's path) tells two builds apart.

Rule: a commit that changes anything under xlkv_autopatch/ is followed (in it or a later commit)
by one that bumps ``__version__`` in xlkv_autopatch/_version.py.  Uncommitted work is not
checked.  Outside a git checkout (an sdist or wheel) there is no history to compare, so the test
skips; in a shallow clone the oldest commit it has counts as the last bump, so it checks only the
commits after it."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERSION_FILE = "xlkv_autopatch/_version.py"


def git(*args):
    r = subprocess.run(["git", "-C", ROOT] + list(args), capture_output=True, text=True, timeout=60)
    return r.stdout.strip() if r.returncode == 0 else None


def _version_at(commit):
    text = git("show", "%s:%s" % (commit, VERSION_FILE))
    m = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", text or "")
    return m.group(1) if m else None


@pytest.fixture(scope="module")
def history():
    if shutil.which("git") is None or git("rev-parse", "--is-inside-work-tree") != "true" \
            or os.path.realpath(git("rev-parse", "--show-toplevel") or "") != os.path.realpath(ROOT):
        pytest.skip("not a git checkout of xlkv_autopatch (an installed sdist/wheel): no history to compare")
    last = git("log", "-1", "--format=%H", "--", VERSION_FILE)
    if not last:
        pytest.skip("%s is not committed yet" % VERSION_FILE)
    return last


def test_no_package_change_since_the_last_version_bump(history):
    changed = git("log", "--format=%h %s", "%s..HEAD" % history, "--", "xlkv_autopatch/")
    assert not changed, (
        "xlkv_autopatch/ changed in these commits after %s last changed (version %s):\n%s\nFix: bump __version__ in "
        "%s (and reinstall: pip install -e .)" % (VERSION_FILE, _version_at("HEAD"), changed[:2000], VERSION_FILE))


def test_the_last_change_of_the_version_file_changed_the_version(history):
    parent = git("rev-parse", "--verify", "--quiet", history + "^")
    if not parent:
        pytest.skip("the commit that last changed %s has no parent here (shallow clone)" % VERSION_FILE)
    before, after = _version_at(parent), _version_at(history)
    assert after and after != before, "%s changed in %s without a new version (%s)" % (VERSION_FILE, history, after)


def test_the_version_is_the_one_the_package_reports():
    import xlkv_autopatch
    from xlkv_autopatch import _version

    assert xlkv_autopatch.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", _version.__version__)
