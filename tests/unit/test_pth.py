"""xlkv_autopatch.pth is rendered from its readable source (xlkv_autopatch/_pth.py), with the off
values of flag.FALSY; the committed copy (what the tests install, and what the build replaces
with the rendering) must be that rendering."""

import os

from xlkv_autopatch import _pth, flag

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_committed_pth_is_the_rendering():
    committed = open(os.path.join(ROOT, _pth.PTH_NAME)).read()
    assert committed == _pth.render(), "xlkv_autopatch.pth is stale: run python -m xlkv_autopatch._pth --write"


def test_the_rendering_takes_the_off_values_from_flag(monkeypatch):
    assert repr(flag.FALSY) in _pth.render()
    monkeypatch.setattr(_pth, "FALSY", flag.FALSY + ("nope",))
    assert "'nope')" in _pth.render()


def test_sitecustomize_reads_the_mark_the_pth_sets():
    assert "sys.%s = True" % _pth.MARK in _pth.render()
    assert '"%s"' % _pth.MARK in open(os.path.join(ROOT, "sitecustomize.py")).read()
