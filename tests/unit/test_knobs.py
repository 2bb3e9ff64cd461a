"""One parser for every knob (flag.knob): the same accepted values everywhere, an unknown value is
an error naming the knob, the value and the accepted values, and start-up refuses it."""

import os
import re
import sys

from pathlib import Path

import pytest

import xlkv_autopatch
from xlkv_autopatch import _startup, flag
from xlkv_autopatch.errors import XlkvFlagError
from xlkv_autopatch.patches import _fallback, transfer_order

PKG = os.path.dirname(os.path.abspath(xlkv_autopatch.__file__))
NAMES = [k.name for k in flag.KNOBS]


def test_the_knobs_are_the_documented_ones():
    assert NAMES == ["ENABLE_XLKV", "XLKV_COALESCE", "XLKV_STRICT", "XLKV_EQUAL_TP", "XLKV_DETOK_TAIL"]
    assert {k.name: k.default for k in flag.KNOBS} == {"ENABLE_XLKV": False, "XLKV_COALESCE": True,
                                                        "XLKV_STRICT": False, "XLKV_EQUAL_TP": False,
                                                        "XLKV_DETOK_TAIL": False}
    # every knob is in the package docstring's table and in docs/mechanism.md's
    docs = (Path(__file__).resolve().parents[2] / "docs" / "mechanism.md").read_text()
    for name in NAMES:
        assert "\n%s " % name in flag.__doc__, name
        assert "| `%s` |" % name in docs, name


@pytest.mark.parametrize("name", NAMES)
def test_every_knob_accepts_the_same_values(name):
    default = {k.name: k.default for k in flag.KNOBS}[name]
    for value in ("1", "true", "TRUE", " Yes ", "on"):
        assert flag.knob(name, {name: value}) is True, value
    for value in ("0", "false", "No", " off "):
        assert flag.knob(name, {name: value}) is False, value
    for env in ({}, {name: ""}, {name: "  "}):
        assert flag.knob(name, env) is default, env


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("value", ["ture", "2", "maybe", "enabled"])
def test_an_unknown_value_of_any_knob_is_an_error_naming_knob_value_and_accepted_values(name, value):
    with pytest.raises(XlkvFlagError) as e:
        flag.knob(name, {name: value})
    msg = str(e.value)
    assert "%s=%r" % (name, value) in msg
    assert "accepted: 1/true/yes/on (on), 0/false/no/off (off), or unset/empty" in msg
    assert "Fix: " in msg and name in msg.split("Fix: ", 1)[1]
    assert flag.knob_errors({name: value}) == [msg]


def test_strict_and_coalesce_go_through_the_knob_parser(monkeypatch):
    """XLKV_STRICT=ture was silently off (lenient truthy)."""
    monkeypatch.setenv("XLKV_STRICT", "ture")
    with pytest.raises(XlkvFlagError, match="XLKV_STRICT='ture'"):
        _fallback.strict()
    monkeypatch.setenv("XLKV_STRICT", "yes")
    assert _fallback.strict() is True
    monkeypatch.delenv("XLKV_STRICT")
    assert _fallback.strict() is False
    with pytest.raises(XlkvFlagError, match="XLKV_COALESCE='garbage'"):
        transfer_order.enabled({"XLKV_COALESCE": "garbage"})
    assert transfer_order.enabled({}) is True


def test_no_module_reads_a_knob_of_its_own_outside_flag_py():
    """A second parser is how the three policies came about: xlkv's variables are read in flag.py
    (knobs) and versions.py (XLKV_VLLM_VERSION) only."""
    pattern = re.compile(r"""environ(?:\.get\(|\[)\s*["'](ENABLE_XLKV|XLKV_\w+)""")
    readers = {}
    for folder, _, names in os.walk(PKG):
        for fname in names:
            if fname.endswith(".py"):
                path = os.path.join(folder, fname)
                for m in pattern.finditer(open(path).read()):
                    readers.setdefault(os.path.relpath(path, PKG), set()).add(m.group(1))
    assert readers == {}, readers  # flag.py and versions.py read them through a name, not a literal
    assert "truthy(os.environ.get(f))" in open(os.path.join(PKG, "patches", "_kvcached.py")).read()  # kvcached's own


@pytest.mark.parametrize("bad", [{"XLKV_COALESCE": "garbage"}, {"XLKV_STRICT": "2"}])
def test_start_up_refuses_a_bad_knob_with_the_flag_on_and_not_with_it_off(monkeypatch, bad):
    installed = []
    monkeypatch.setattr("xlkv_autopatch.registry.REGISTRY.install", lambda **kw: installed.append(kw))
    for k, v in bad.items():
        monkeypatch.setenv(k, v)
    assert _startup.activate("test") is False  # flag off: stock, nothing refused
    monkeypatch.setenv("ENABLE_XLKV", "1")
    with pytest.raises(XlkvFlagError) as e:
        _startup.activate("test")
    (name, value), = bad.items()
    assert "%s=%r" % (name, value) in str(e.value)
    assert installed == []  # refused before anything is patched


def test_every_bad_knob_is_named_in_one_refusal(monkeypatch):
    monkeypatch.setenv("ENABLE_XLKV", "1")
    monkeypatch.setenv("XLKV_COALESCE", "garbage")
    monkeypatch.setenv("XLKV_STRICT", "ture")
    with pytest.raises(XlkvFlagError) as e:
        _startup.activate("test")
    assert "XLKV_COALESCE='garbage'" in str(e.value) and "XLKV_STRICT='ture'" in str(e.value)


REMOVED = ["XLKV_EARLY_LOAD", "XLKV_NOTICE_WAIT"]


def test_the_removed_knobs_are_gone_from_the_package_and_named_as_removed():
    """0.4.0 removed the handoff levers: no knob, no patch file, no code reads them; only
    flag.REMOVED names them, and the docs say they were removed."""
    assert sorted(flag.REMOVED) == REMOVED and all(v[0] == "0.4.0" for v in flag.REMOVED.values())
    assert not set(REMOVED) & set(NAMES)
    for name in ("kv_load_start.py", "kv_receive_notice.py"):
        assert not os.path.exists(os.path.join(PKG, "patches", name))
    for folder, _, names in os.walk(PKG):
        for fname in names:
            if fname.endswith(".py") and fname != "flag.py":
                text = open(os.path.join(folder, fname)).read()
                assert not any(n in text for n in REMOVED), fname
    docs = (Path(__file__).resolve().parents[2] / "docs" / "mechanism.md").read_text()
    for name in REMOVED:
        assert "| `%s` |" % name not in docs  # no longer a knob of the table
        assert "`%s`" % name in docs and "removed in 0.4.0" in docs


@pytest.mark.parametrize("value", ["1", "0", "garbage"])
def test_a_removed_knob_is_a_note_whatever_its_value_never_an_error(value):
    env = {"XLKV_EARLY_LOAD": value, "ENABLE_XLKV": "1"}
    assert flag.knob_errors(env) == []
    (note,) = flag.removed_knob_notes(env)
    assert note.startswith("XLKV_EARLY_LOAD=%r: XLKV_EARLY_LOAD was removed in xlkv_autopatch 0.4.0 (" % value)
    assert "it has no effect. Fix: unset XLKV_EARLY_LOAD" in note
    assert flag.removed_knob_notes({"XLKV_EARLY_LOAD": " ", "XLKV_NOTICE_WAIT": ""}) == []
    both = flag.removed_knob_notes({"XLKV_EARLY_LOAD": "1", "XLKV_NOTICE_WAIT": "1"})
    assert [n.split("=")[0] for n in both] == REMOVED


def test_start_up_warns_once_per_process_about_a_removed_knob_and_activates(monkeypatch, caplog):
    from xlkv_autopatch import logs

    installed = []
    monkeypatch.setattr("xlkv_autopatch.registry.REGISTRY.install", lambda **kw: installed.append(kw))
    monkeypatch.setattr(logs, "_seen", set())
    monkeypatch.setenv("XLKV_NOTICE_WAIT", "1")
    with caplog.at_level("WARNING", logger="vllm.xlkv_autopatch"):
        assert _startup.activate("test") is False  # flag off: nothing, not even the warning
        assert caplog.records == []
        monkeypatch.setenv("ENABLE_XLKV", "1")
        assert _startup.activate("test") is True and _startup.activate("again") is True
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "XLKV_NOTICE_WAIT was removed in xlkv_autopatch 0.4.0" in warnings[0], warnings
    assert len(installed) == 2  # not a refusal: the shim activates as without the knob


@pytest.mark.parametrize("source, says, never", [
    ("sitecustomize", "from a source checkout's sitecustomize.py on PYTHONPATH", "--no-deps"),
    ("pth", "installed with --no-deps", "sitecustomize"),
    ("vllm_plugin", "installed with --no-deps", "sitecustomize"),
])
def test_a_missing_dependency_names_the_activation_path_that_ran(monkeypatch, source, says, never):
    """On the checkout's sitecustomize path nothing was installed, so "--no-deps" is not the cause."""
    from xlkv_autopatch.errors import XlkvDependencyError
    monkeypatch.setenv("ENABLE_XLKV", "1")
    monkeypatch.setitem(sys.modules, "wrapt", None)  # import wrapt raises ImportError
    with pytest.raises(XlkvDependencyError) as e:
        _startup.activate(source)
    assert "pip install 'wrapt>=1.14'" in str(e.value) and says in str(e.value) and never not in str(e.value)


@pytest.mark.parametrize("release, knob, says", [
    ("0.33.0", "XLKV_EQUAL_TP", "it does nothing on vLLM 0.33: xlkv's heads-outermost BHLNC rows serve any TP"),
    ("0.14.1", "XLKV_DETOK_TAIL", "it does nothing on vLLM 0.14: its detokenizer primes no prompt"),
])
def test_start_up_warns_once_about_a_knob_that_does_nothing_on_this_release(monkeypatch, caplog, release, knob, says):
    """The run says what status says (facts.knob_no_effect): a knob set on that this release ignores is one
    WARNING per process; the same knob on a release where it acts, and any knob with the flag off, say nothing."""
    from xlkv_autopatch import facts, logs

    monkeypatch.setattr("xlkv_autopatch.registry.REGISTRY.install", lambda **kw: None)
    monkeypatch.setattr(logs, "_seen", set())
    monkeypatch.setenv(knob, "true")
    monkeypatch.setenv("XLKV_VLLM_VERSION", release)
    facts.reset()
    try:
        with caplog.at_level("WARNING", logger="vllm.xlkv_autopatch"):
            assert _startup.activate("test") is False and caplog.records == []  # flag off: nothing
            monkeypatch.setenv("ENABLE_XLKV", "1")
            assert _startup.activate("test") is True and _startup.activate("again") is True
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warnings == [w for w in warnings if w.startswith("xlkv_autopatch: %s is set, but %s" % (knob, says))]
        assert len(warnings) == 1, warnings
        caplog.clear()
        monkeypatch.setattr(logs, "_seen", set())
        monkeypatch.setenv("XLKV_VLLM_VERSION", "0.26.0")  # both knobs act on 0.26
        facts.reset()
        with caplog.at_level("WARNING", logger="vllm.xlkv_autopatch"):
            assert _startup.activate("test") is True
        assert [r for r in caplog.records if r.levelname == "WARNING"] == []
    finally:
        facts.reset()


def test_the_detok_switch_is_said_to_do_nothing_in_dynamos_worker_only(monkeypatch, caplog, tmp_path):
    """NVIDIA Dynamo's vLLM worker never builds vLLM's detokenizer (its frontend detokenizes: the GPU lease of
    2026-11-29 saw the switch's patch set never applied there).  The run says so once the worker's module is loaded
    (after a patch set is applied: start-up comes before Dynamo imports vLLM); a release where the switch does
    nothing anyway keeps its own reason; status says it where Dynamo's worker is installed."""
    import types
    from xlkv_autopatch import facts, logs, registry, status_report

    f33, f14 = facts.facts_for("0.33.0"), facts.facts_for("0.14.1")
    env = {"XLKV_DETOK_TAIL": "true"}
    assert facts.knob_no_effect("XLKV_DETOK_TAIL", f33, "on", env, modules={}) is None
    assert facts.knob_no_effect("XLKV_DETOK_TAIL", f33, "on", env, modules={"dynamo.vllm": None}) == facts.DYNAMO_DETOK
    assert "primes no prompt" in facts.knob_no_effect("XLKV_DETOK_TAIL", f14, "on", env, modules={"dynamo.vllm": None})
    assert facts.knob_no_effect("XLKV_EQUAL_TP", facts.facts_for("0.26.0"), "on", {"XLKV_EQUAL_TP": "true"},
                                modules={"dynamo.vllm": None}) is None
    # the run: nothing before Dynamo's worker module is loaded, one WARNING after, none again
    monkeypatch.setattr(logs, "_seen", set())
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.33.0")
    monkeypatch.delitem(sys.modules, "dynamo.vllm", raising=False)
    facts.reset()
    try:
        with caplog.at_level("WARNING", logger="vllm.xlkv_autopatch"):
            registry.warn_inert_knobs()
            assert caplog.records == []
            monkeypatch.setitem(sys.modules, "dynamo.vllm", types.ModuleType("dynamo.vllm"))
            registry.warn_inert_knobs()
            registry.warn_inert_knobs()
        assert [r.getMessage() for r in caplog.records] == [
            "xlkv_autopatch: XLKV_DETOK_TAIL is set, but " + facts.DYNAMO_DETOK]
    finally:
        facts.reset()
    # status: Dynamo's worker installed beside vLLM (found, not imported)
    monkeypatch.delitem(sys.modules, "dynamo.vllm", raising=False)
    assert not facts.dynamo_worker_installed() or "dynamo" in sys.modules
    (tmp_path / "dynamo" / "vllm").mkdir(parents=True)
    (tmp_path / "dynamo" / "__init__.py").write_text("raise RuntimeError('status must not import Dynamo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert facts.dynamo_worker_installed()
    monkeypatch.setenv("ENABLE_XLKV", "true")
    facts.reset()
    try:
        info = status_report.collect(resolve=False)
    finally:
        facts.reset()
    [k] = [k for k in info["knobs"] if k["name"] == "XLKV_DETOK_TAIL"]
    assert k["no_effect"] is None and k["no_effect_under_dynamo"] == facts.DYNAMO_DETOK
    assert ("NVIDIA Dynamo is installed here, and %s (in `vllm serve` it acts)" % facts.DYNAMO_DETOK
            in status_report.render(info))
