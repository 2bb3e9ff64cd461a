"""The tracked tree travels with every device call (its tar counts into the call's 64 MiB with the bundle's
chunk), so it stays small: the raw logs of each run are one ``experiments/results/logs-<run>.tar.xz``
(experiments/pdtools/archive.py), readable member by member, and a log file a test reads line by line stays
plain beside it only as the archive's member byte for byte.  Pure file reads, no vLLM."""

import io
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "experiments", "results")
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from pdtools import archive  # noqa: E402

#: the most the tracked tree may weigh (the sum of `git ls-files`' sizes): the archives brought it from
#: 23.2 MB to 12.05 MB, and the biggest results JSON kept as ``X.json.xz`` (read as ``X.json`` through
#: pdtools/archive.py's ``load_json``) to 9.5 MB (experiments/README.md, "The tracked tree").
LIMIT_BYTES = 10_000_000


def _tracked():
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked tree to weigh")
    return [p for p in out.decode().split("\0") if p]


def _archives():
    return sorted(n for n in os.listdir(RESULTS) if n.startswith("logs-") and n.endswith(".tar.xz"))


def test_the_tracked_tree_stays_small():
    paths = _tracked()
    size = sum(os.path.getsize(os.path.join(ROOT, p)) for p in paths if os.path.isfile(os.path.join(ROOT, p)))
    assert size <= LIMIT_BYTES, "the tracked tree is %d bytes, over %d: compress raw logs or data (%s)" % (
        size, LIMIT_BYTES, "experiments/README.md, The tracked tree")


def test_no_run_keeps_its_raw_logs_unpacked():
    """Every logs-<run>/ folder left in results has its archive, and holds only files that are members of it
    byte for byte (the plain copies tools/docfigures.py reads); no .tgz travels outside an archive."""
    folders = sorted(n for n in os.listdir(RESULTS) if n.startswith("logs-") and os.path.isdir(os.path.join(RESULTS, n)))
    assert folders, "tools/docfigures.py reads plain log files: some folder should remain"
    for folder in folders:
        path = os.path.join(RESULTS, folder + ".tar.xz")
        assert os.path.exists(path), "%s/ has no %s.tar.xz" % (folder, folder)
        for dirpath, _, names in os.walk(os.path.join(RESULTS, folder)):
            for n in names:
                rel = os.path.relpath(os.path.join(dirpath, n), os.path.join(RESULTS, folder)).replace(os.sep, "/")
                with open(os.path.join(dirpath, n), "rb") as f:
                    assert archive.read(path, rel) == f.read(), "%s/%s differs from its archive's member" % (folder,
                                                                                                             rel)
    assert not [p for p in _tracked() if p.endswith(".tgz")]


@pytest.mark.parametrize("name", _archives())
def test_every_logs_archive_lists_and_reads_its_members(name):
    path = os.path.join(RESULTS, name)
    members = archive.members(path)
    assert members, name
    assert any(m.endswith(("console.txt", ".md")) or "console" in m for m in members), (name, members[:5])
    with tarfile.open(path, "r:xz") as tar:
        top = name[:-len(".tar.xz")]
        assert all(m.name == top or m.name.startswith(top + "/") for m in tar.getmembers()), name
        assert {m.mtime for m in tar.getmembers()} == {archive.MTIME}, name
    first = archive.read(path, members[0])
    assert isinstance(first, bytes)
    with pytest.raises(KeyError):
        archive.read(path, "no-such-member.txt")


def test_packing_is_deterministic_and_unpacks_a_tgz(tmp_path):
    run = tmp_path / "logs-2099-01-01-test"
    (run / "call1").mkdir(parents=True)
    (run / "call1" / "console.txt").write_text("console\n")
    (run / "calls.md").write_text("calls\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tgz:
        info = tarfile.TarInfo("bench/r1.json")
        info.size = 3
        tgz.addfile(info, io.BytesIO(b"{}\n"))
    (run / "call2-raw.tgz").write_bytes(buf.getvalue())
    a = archive.pack(str(run))
    assert a == str(run) + ".tar.xz"
    assert archive.members(a) == ["call1/console.txt", "call2-raw/bench/r1.json", "calls.md"]
    assert archive.read(a, "call2-raw/bench/r1.json") == b"{}\n"
    first = open(a, "rb").read()
    os.utime(run / "calls.md", (0, 0))
    assert open(archive.pack(str(run), str(tmp_path / "again.tar.xz")), "rb").read() == first
    (run / "calls.md").write_text("calls, changed\n")
    assert open(archive.pack(str(run), str(tmp_path / "other.tar.xz")), "rb").read() != first
