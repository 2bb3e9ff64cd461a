"""``python -m xlkv_autopatch status`` predicts every start-up refusal it can know of: knob values,
XLKV_VLLM_VERSION, a release without a patch set, kvcached; and says where the shim is and what
to do without vLLM.  In-process (``__main__.main``) over package metadata of a stand-in vLLM
(``--no-resolve``: nothing of vLLM is imported); the resolution of real patch targets is
tests/real/test_real_vllm.py."""

import os
import re

import pytest

import xlkv_autopatch
from xlkv_autopatch import __main__ as cli

PKG = os.path.dirname(os.path.abspath(xlkv_autopatch.__file__))
OURS = ("ENABLE_XLKV", "XLKV_COALESCE", "XLKV_STRICT", "XLKV_EQUAL_TP", "XLKV_DETOK_TAIL", "XLKV_VLLM_VERSION", "ENABLE_KVCACHED", "KVCACHED_AUTOPATCH",
        "VLLM_KV_CACHE_LAYOUT",
        "VLLM_PLUGINS", "XLKV_EARLY_LOAD", "XLKV_NOTICE_WAIT")


@pytest.fixture
def status(monkeypatch, capsys, tmp_path, stand_in_vllm):
    """status(vllm=None|"0.33.0", **env) -> (exit code, text)."""
    for name in OURS:
        monkeypatch.delenv(name, raising=False)

    def run(vllm=None, *args, **env):
        for name in OURS:
            monkeypatch.delenv(name, raising=False)
        if vllm:
            stand_in_vllm(vllm)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        rc = cli.main(["status", "--no-resolve"] + list(args))
        return rc, capsys.readouterr().out

    return run


def problems(text):
    return [l for l in text.splitlines() if l.startswith("PROBLEM: ")]


def test_healthy_configuration_is_ok(status):
    rc, text = status("0.33.0", ENABLE_XLKV="true")
    assert rc == 0 and text.startswith("status: OK\n") and problems(text) == [], text
    assert text.count("status: ") == 1, text  # one verdict line, the first
    assert "vLLM: 0.33.0  [supported: >=0.12,<0.34]" in text


@pytest.mark.parametrize("env", [{"XLKV_COALESCE": "garbage"}, {"XLKV_STRICT": "2"}, {"XLKV_STRICT": "ture"},
                                 {"ENABLE_XLKV": "maybe"}])
@pytest.mark.parametrize("flag", ["true", None])
def test_every_knob_error_is_a_problem_and_a_non_zero_exit(status, env, flag):
    """XLKV_COALESCE=garbage gave "status: OK", exit 0, while every cross-layer
    worker then stopped with XlkvFlagError; XLKV_STRICT=2 was silently off."""
    if flag and "ENABLE_XLKV" not in env:
        env = dict(env, ENABLE_XLKV=flag)
    rc, text = status("0.33.0", **env)
    (name, value), = [(k, v) for k, v in env.items() if k != "ENABLE_XLKV" or v == "maybe"]
    assert rc == 1 and text.startswith("status: NOT OK ("), text
    (line,) = [p for p in problems(text) if "%s=%r" % (name, value) in p]
    assert "accepted: 1/true/yes/on (on), 0/false/no/off (off), or unset/empty" in line and "Fix: " in line
    assert "%s: %r -> NOT RECOGNISED" % (name, value) in text


def test_without_vllm_it_says_where_the_shim_is_the_range_and_what_to_do(status):
    """status printed "ENABLE_XLKV: None", no word on installing into vLLM's environment or the range."""
    rc, text = status()
    assert rc == 1
    assert "None" not in text and "ENABLE_XLKV: unset -> off (stock vLLM)" in text
    assert "XLKV_COALESCE: unset -> on (default)" in text and "XLKV_STRICT: unset -> off (default)" in text
    first = text.splitlines()[1]  # after the verdict
    assert first.startswith("xlkv_autopatch %s at %s " % (xlkv_autopatch.__version__, PKG)), first
    (line,) = problems(text)
    assert "vLLM is not installed in this environment" in line and "vLLM >=0.12,<0.34" in line
    assert "install it into vLLM's environment" in line
    rc, text = status(XLKV_VLLM_VERSION="0.21.0")  # an override is no vLLM
    assert rc == 1 and [p for p in problems(text) if "vLLM is not installed in this environment" in p], text
    assert "vLLM: not installed in this environment" in text


def test_an_override_naming_another_release_is_shown_with_both_versions(status):
    """status printed "vLLM: 0.21.0 [supported]" with 0.33.0 installed."""
    rc, text = status("0.33.0", ENABLE_XLKV="true", XLKV_VLLM_VERSION="0.21.0")
    assert "vLLM: 0.33.0 installed; XLKV_VLLM_VERSION=0.21.0 overrides it, so the patch sets of vLLM 0.21.0 are " \
           "used" in text, text
    assert "XLKV_VLLM_VERSION: '0.21.0' (the installed package says 0.33.0)" in text
    rc, text = status("0.33.0", ENABLE_XLKV="true", XLKV_VLLM_VERSION="0.11.2")
    (line,) = problems(text)
    assert rc == 1 and "vLLM 0.11.2 is not supported" in line
    assert "XLKV_VLLM_VERSION=0.11.2" in line and "0.33.0" in line and "Fix: unset XLKV_VLLM_VERSION" in line


def test_a_release_without_a_patch_set_is_predicted(status):
    """0.24.0.devN lies in >=0.12,<0.34 but in no patch set's range: start-up refuses it, so must status."""
    rc, text = status("0.24.0.dev5", ENABLE_XLKV="true")
    assert rc == 1 and any("no patch set covers vLLM 0.24.0.dev5" in p and "XLKV_VLLM_VERSION" in p
                           for p in problems(text)), text
    rc, text = status("0.24.0.dev5")  # flag off: the same problem, said to come once the flag is on
    assert rc == 1 and any(p.startswith("PROBLEM: (ENABLE_XLKV is off; once it is on:)") for p in problems(text))


def test_kvcached_conflict_is_predicted_without_resolving(status):
    rc, text = status("0.33.0", ENABLE_XLKV="true", ENABLE_KVCACHED="true")
    assert rc == 1 and [p for p in problems(text) if "ENABLE_KVCACHED and ENABLE_XLKV are both set" in p], text
    rc, text = status("0.33.0", ENABLE_KVCACHED="true")
    assert rc == 0, text  # kvcached alone is not xlkv's business


def test_json_has_the_knobs(status):
    import json

    rc, text = status("0.33.0", "--json", XLKV_STRICT="ture")
    info = json.loads(text)
    assert rc == 1 and info["ok"] is False
    knobs = {k["name"]: k for k in info["knobs"]}
    assert knobs["XLKV_STRICT"]["state"] == "invalid" and knobs["XLKV_COALESCE"]["state"] == "on"
    assert info["xlkv_autopatch_path"] == PKG and info["vllm_installed"] == "0.33.0"
    assert re.match(r"\d+\.\d+\.\d+", info["xlkv_autopatch"])


def test_a_patch_set_waiting_for_a_module_vllm_never_imports_is_predicted(tmp_path):
    """XLKV_VLLM_VERSION=0.16.0 on a vLLM whose connector factory loads NixlConnector from the
    0.20+ package while the old module still exists: every target may resolve when status
    imports the old module itself, but vLLM never imports it, so the patch set never attaches
    and the first NIXL connector stops with XlkvNotAttachedError.  (Subprocess: a stand-in
    vLLM must not stay in this test process's sys.modules.)"""
    import json
    import subprocess
    import sys
    import textwrap

    v1 = tmp_path / "vllm" / "distributed" / "kv_transfer" / "kv_connector" / "v1"
    (v1 / "nixl").mkdir(parents=True)
    for d in (tmp_path / "vllm", tmp_path / "vllm" / "distributed", v1.parent.parent, v1.parent, v1):
        (d / "__init__.py").write_text("")
    (v1 / "nixl" / "__init__.py").write_text("class NixlConnector:\n    pass\n")
    (v1 / "nixl_connector.py").write_text("from .nixl import NixlConnector  # an old path kept for imports\n")
    (v1.parent / "factory.py").write_text(textwrap.dedent("""
        import importlib

        class KVConnectorFactory:
            @classmethod
            def create_connector(cls, config, role, kv_cache_config=None):
                return cls.get_connector_class_by_name("NixlConnector")()

            @classmethod
            def get_connector_class_by_name(cls, name):
                return importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.nixl").NixlConnector
    """))
    meta = tmp_path / "vllm-0.33.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    env = {k: v for k, v in os.environ.items() if k not in OURS + ("PYTHONPATH",)}
    env.update(PYTHONPATH=str(tmp_path), XLKV_VLLM_VERSION="0.16.0")
    r = subprocess.run([sys.executable, "-m", "xlkv_autopatch", "status", "--json"], capture_output=True, text=True,
                       env=env, cwd="/", timeout=120)
    info = json.loads(r.stdout)
    (line,) = [p for p in info["problems"] if "waits for the import of" in p]
    assert "patch set native-0.16" in line and "v1.nixl_connector" in line and "XlkvNotAttachedError" in line
    assert "XLKV_VLLM_VERSION=0.16.0" in line and "Fix: unset XLKV_VLLM_VERSION" in line
    assert r.returncode == 1


def test_a_stale_start_up_hook_or_metadata_is_noted(status, monkeypatch, tmp_path):
    """An editable install copies the .pth once: after an upgrade of the checkout it is the old hook
    (e.g. without the once-per-process guard).  A NOTE, not a failure: it still works."""
    from xlkv_autopatch import _pth, status_report

    old = tmp_path / "xlkv_autopatch.pth"
    old.write_text(_pth.render().replace(" and not getattr(sys, '%s', False)" % _pth.MARK, ""))
    fresh = tmp_path / "fresh" / "xlkv_autopatch.pth"
    fresh.parent.mkdir()
    fresh.write_text(_pth.render())
    monkeypatch.setattr(status_report, "pth_files", lambda: [str(old), str(fresh)])
    rc, text = status("0.33.0")
    notes = [l for l in text.splitlines() if l.startswith("NOTE: ")]
    assert [n for n in notes if str(old) in n and "reinstall" in n] and not [n for n in notes if str(fresh) in n]
    assert rc == 0, text


def notes(text):
    return [l for l in text.splitlines() if l.startswith("NOTE: ")]


def refusals(text):
    """The run-time refusal lines status lists for the installed release."""
    lines = text.splitlines()
    head = [i for i, l in enumerate(lines) if l.startswith("refused at run time on vLLM ")]
    if not head:
        return []
    out = []
    for l in lines[head[0] + 1:]:
        if not l.startswith("  - "):
            break
        out.append(l[4:])
    return out


@pytest.mark.parametrize("flag", ["true", None])
def test_a_knob_error_says_what_happens_whatever_the_activation_path(status, flag):
    """status said "vLLM refuses to start" while the checkout's sitecustomize.py ran
    stock; every path now refuses alike, and status says how."""
    env = {"XLKV_COALESCE": "2"}
    if flag:
        env["ENABLE_XLKV"] = flag
    rc, text = status("0.33.0", **env)
    (line,) = problems(text)
    assert "vLLM refuses to start, whatever the activation path: the .pth hook and the checkout's " \
           "sitecustomize.py raise this error at every import of vLLM, the vLLM plugin when vLLM loads it" in line
    assert ("once ENABLE_XLKV is on" in line) is (flag is None), line


@pytest.mark.parametrize("name", ["XLKV_EARLY_LOAD", "XLKV_NOTICE_WAIT"])
@pytest.mark.parametrize("value", ["1", "maybe"])
def test_a_removed_lever_is_a_note_not_a_problem(status, name, value):
    """The handoff levers were removed in 0.4.0; a deployment that still sets one is told, not refused."""
    rc, text = status("0.33.0", ENABLE_XLKV="true", **{name: value})
    assert rc == 0 and problems(text) == [], text
    (note,) = [n for n in notes(text) if name in n]
    assert "%s was removed in xlkv_autopatch 0.4.0 (" % name in note and "); it has no effect" in note, note
    assert "%s: " % name not in text  # no longer listed as a knob


@pytest.mark.parametrize("vllm", ["0.12.0", "0.14.1", "0.21.0"])
def test_the_one_sided_hazard_of_0_12_to_0_21_is_named_flag_off_and_on(status, vllm):
    """Flag on P only, the stock decode worker dies (vLLM's own KeyError in get_finished);
    the shim cannot guard a side without the flag, so status names it on both sides."""
    rc, text = status(vllm)
    (note,) = [n for n in notes(text) if "KeyError" in n]
    assert rc == 0 and "vLLM %s (0.12-0.21), ENABLE_XLKV is off here: if the peer engine has ENABLE_XLKV=true, " \
                       "the NIXL handshake is refused and, if this engine decodes, it dies" % vllm[:4] in note, note
    assert "Fix: set ENABLE_XLKV=true on both sides" in note
    rc, text = status(vllm, ENABLE_XLKV="true")
    (note,) = [n for n in notes(text) if "KeyError" in n]
    assert rc == 0 and "the peer engine must have ENABLE_XLKV=true too" in note, note


@pytest.mark.parametrize("vllm", ["0.22.0", "0.26.0", "0.33.0"])
def test_no_one_sided_hazard_where_vllm_skips_failed_receives(status, vllm):
    for env in ({}, {"ENABLE_XLKV": "true"}):
        rc, text = status(vllm, **env)
        assert "KeyError" not in text and "must have ENABLE_XLKV" not in text, text


def test_the_hazard_follows_the_release_table(status, monkeypatch):
    """Derived from the table's failed_recv_looks_up_engine column, not a version typed into status."""
    from dataclasses import replace

    from xlkv_autopatch import releases

    rows = tuple(replace(r, failed_recv_looks_up_engine=True) if r.release == "0.26" else r for r in releases.RELEASES)
    monkeypatch.setattr(releases, "RELEASES", rows)
    rc, text = status("0.26.0")
    (note,) = [n for n in notes(text) if "KeyError" in n]
    assert "vLLM 0.26 (0.12-0.21, 0.26)" in note, note


def test_runtime_refusals_of_0_33(status):
    """status predicts the run-time refusals of the installed release."""
    rc, text = status("0.33.0", ENABLE_XLKV="true")
    got = refusals(text)
    assert rc == 0 and len(got) == 4, text
    assert got[0].startswith("a peer engine without ENABLE_XLKV=true") and "compatibility hash" in got[0]
    assert got[1].startswith("a different block size on prefill and decode")
    # heterogeneous TP is served on heads-outermost rows; only rows whose heads do not tile are refused
    assert got[2].startswith("heterogeneous TP where this engine's BHLNC block rows are padded"), got[2]
    assert "with any backend" not in got[2] and "vLLM itself refuses prefill TP > decode TP" in got[2], got[2]
    assert got[3].startswith("KV tensors holding more blocks than the scheduler's budget")


@pytest.mark.parametrize("vllm, tp", [
    # refused only with XLKV_EQUAL_TP=true; without it the engine keeps the stock layout
    ("0.21.0", "with FLASHINFER/TRITON_ATTN and XLKV_EQUAL_TP=true: the handshake is refused (cross-layer blocks of a "
               "blocks-first backend (K/V outermost) cannot be sliced by heads for heterogeneous TP); without "
               "XLKV_EQUAL_TP (the default) such an engine keeps the stock layout, says so in one INFO line, and every "
               "pairing is served as stock serves it; FLASH_ATTN keeps cross-layer blocks and is served (heads are "
               "outermost in a FlashAttention cross-layer block)"),
    ("0.24.0", "with any backend and XLKV_EQUAL_TP=true: the handshake is refused (cross-layer blocks of a blocks-first"),
    ("0.26.0", "with FLASHINFER/TRITON_ATTN and XLKV_EQUAL_TP=true: the handshake"),
    ("0.12.0", "with FLASHINFER and XLKV_EQUAL_TP=true: the handshake")])
def test_runtime_refusals_follow_the_release(status, vllm, tp):
    rc, text = status(vllm)  # flag off too: what would be refused once it is on
    got = refusals(text)
    assert [l for l in got if l.startswith("heterogeneous TP") and tp in l], got
    assert got[-1] == "KV tensors that disagree on their block count: registration with NIXL is refused at start-up"
    assert not [l for l in got if "scheduler's budget" in l]  # 0.18-0.28 register them whole
    assert ("compares no hash" in got[0]) is (vllm == "0.12.0"), got[0]


def test_runtime_refusals_are_derived_from_the_release_table(status, monkeypatch):
    from dataclasses import replace

    from xlkv_autopatch import releases

    before = [l for l in refusals(status("0.26.0")[1]) if l.startswith("heterogeneous TP")]
    rows = tuple(replace(r, fa_heads_outermost=False) if r.release == "0.26" else r for r in releases.RELEASES)
    monkeypatch.setattr(releases, "RELEASES", rows)
    after = [l for l in refusals(status("0.26.0")[1]) if l.startswith("heterogeneous TP")]
    assert "FLASH_ATTN keeps cross-layer blocks and is served" in before[0] and "with any backend" in after[0], \
        (before, after)


def test_an_explicit_stock_layout_is_predicted_and_strict_refuses_it(status):
    """0.29+: VLLM_KV_CACHE_LAYOUT=LBHNC with the flag on runs the stock layout (vLLM
    never asks the connector): status says so, and with XLKV_STRICT=1 it is a problem (the engine refuses)."""
    rc, text = status("0.33.0", ENABLE_XLKV="true", VLLM_KV_CACHE_LAYOUT="LBHNC")
    assert rc == 0, text
    assert any("the stock per-layer KV layout runs" in n and "VLLM_KV_CACHE_LAYOUT=LBHNC is set explicitly" in n
               for n in notes(text)), text
    rc, text = status("0.33.0", ENABLE_XLKV="true", VLLM_KV_CACHE_LAYOUT="LBHNC", XLKV_STRICT="1")
    assert rc == 1 and "PROBLEM: XLKV_STRICT=1 and ENABLE_XLKV is set, but the stock per-layer KV layout would run" \
        in text, text
    # xlkv's own layout set explicitly, the flag off, or a release before layouts: nothing to say
    for env in (dict(ENABLE_XLKV="true", VLLM_KV_CACHE_LAYOUT="BHLNC", XLKV_STRICT="1"),
                dict(VLLM_KV_CACHE_LAYOUT="LBHNC", XLKV_STRICT="1")):
        rc, text = status("0.33.0", **env)
        assert rc == 0 and "VLLM_KV_CACHE_LAYOUT" not in "".join(notes(text)), text


@pytest.mark.parametrize("vllm,env,want", [
    ("0.33.0", {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"},
     "switch XLKV_DETOK_TAIL on vLLM 0.33.0: each request's first token is decoded against the prompt's last 64 "
     "token ids, not the whole prompt as vLLM 0.33 does"),
    ("0.33.0", {"ENABLE_XLKV": "true"},
     "switch XLKV_DETOK_TAIL on vLLM 0.33.0: off: vLLM 0.33 decodes the whole prompt when each request's first token "
     "reaches the API server (set XLKV_DETOK_TAIL=true"),
    ("0.21.0", {"XLKV_DETOK_TAIL": "true"},
     "switch XLKV_DETOK_TAIL on vLLM 0.21.0: nothing: ENABLE_XLKV is not on, so the shim is not active"),
    ("0.16.0", {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"},
     "switch XLKV_DETOK_TAIL on vLLM 0.16.0: nothing on vLLM 0.16: its detokenizer primes no prompt (vLLM 0.17-0.33 "
     "prime the whole prompt; nothing is wrapped here)"),
])
def test_status_says_what_each_switch_does_on_the_installed_release(status, vllm, env, want):
    """`status` says for each switch what it does on the installed release."""
    rc, text = status(vllm, **env)
    assert rc == 0 and want in text, text


def test_an_unknown_switch_value_is_refused_like_any_knob(status):
    rc, text = status("0.33.0", ENABLE_XLKV="true", XLKV_DETOK_TAIL="64")
    assert rc == 1 and any("XLKV_DETOK_TAIL='64'" in p for p in problems(text)), text
    assert "switch XLKV_DETOK_TAIL on vLLM 0.33.0: not recognised" in text


@pytest.mark.parametrize("vllm, value, near", [
    ("0.33.0", "bhlnc", "BHLNC"), ("0.33.0", "HND ", "HND"), ("0.33.0", "", None), ("0.33.0", "BHNLC", None),
    # 0.12-0.28 know NHD and HND only (their envs.py): a 0.29+ layout name stops them
    ("0.21.0", "LBHNC", None), ("0.14.1", "hnd", "HND")])
@pytest.mark.parametrize("flag", ["true", None])
def test_a_layout_value_vllm_refuses_is_one_problem(status, vllm, value, near, flag):
    """vLLM compares VLLM_KV_CACHE_LAYOUT as written with its own list (envs.py env_with_choices: case and
    blanks included) and stops with "Invalid value ..."; status said "OK" (it upper-cased and stripped it)."""
    env = dict(VLLM_KV_CACHE_LAYOUT=value, **({"ENABLE_XLKV": flag} if flag else {}))
    rc, text = status(vllm, **env)
    (line,) = problems(text)
    assert rc == 1 and text.startswith("status: NOT OK (1 problem"), text
    assert "vLLM stops at start-up with \"Invalid value %r for VLLM_KV_CACHE_LAYOUT\", with or without " \
           "ENABLE_XLKV" % value in line, line
    assert ("Fix: set VLLM_KV_CACHE_LAYOUT=%s (capitals, no blanks) or unset it" % near if near else
            "Fix: set it to one of those values or unset it") in line, line
    assert "VLLM_KV_CACHE_LAYOUT" not in "".join(notes(text)), notes(text)  # said once


@pytest.mark.parametrize("vllm, value", [("0.33.0", "BHLNC"), ("0.33.0", "LBHNC"), ("0.33.0", "NHD"),
                                         ("0.21.0", "HND"), ("0.14.1", "NHD")])
def test_a_layout_value_vllm_accepts_is_no_problem(status, vllm, value):
    rc, text = status(vllm, VLLM_KV_CACHE_LAYOUT=value)
    assert rc == 0 and problems(text) == [], text


def knob_line(text, name):
    (line,) = [l for l in text.splitlines() if l.startswith(name + ": ")]
    return line


@pytest.mark.parametrize("vllm, env, name, said", [
    ("0.33.0", {"ENABLE_XLKV": "true", "XLKV_EQUAL_TP": "true"}, "XLKV_EQUAL_TP",
     "'true' -> on, but it does nothing on vLLM 0.33: xlkv's heads-outermost BHLNC rows serve any TP pairing (it "
     "acts on vLLM 0.12-0.28 only)"),
    ("0.29.0", {"ENABLE_XLKV": "true", "XLKV_EQUAL_TP": "1"}, "XLKV_EQUAL_TP", "'1' -> on, but it does nothing on "
                                                                                "vLLM 0.29"),
    ("0.26.0", {"ENABLE_XLKV": "true", "XLKV_EQUAL_TP": "true"}, "XLKV_EQUAL_TP", "'true' -> on"),
    ("0.33.0", {"XLKV_DETOK_TAIL": "true"}, "XLKV_DETOK_TAIL",
     "'true' -> on, but it does nothing while ENABLE_XLKV is not on (the shim is not active)"),
    ("0.16.0", {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"}, "XLKV_DETOK_TAIL",
     "'true' -> on, but it does nothing on vLLM 0.16: its detokenizer primes no prompt (it acts on vLLM 0.17-0.33)"),
    ("0.33.0", {"ENABLE_XLKV": "true", "XLKV_DETOK_TAIL": "true"}, "XLKV_DETOK_TAIL", "'true' -> on"),
])
def test_a_knob_that_does_nothing_on_this_release_says_so(status, vllm, env, name, said):
    """XLKV_EQUAL_TP=true on 0.29+ was shown "on" (it acts on 0.12-0.28 only); XLKV_DETOK_TAIL=true without
    ENABLE_XLKV, or on a release whose detokenizer primes no prompt, does nothing and no line said so."""
    rc, text = status(vllm, **env)
    line = knob_line(text, name)
    assert line == "%s: %s" % (name, said) if said.endswith("'true' -> on") else said in line, line
    assert rc == 0, text


def test_a_bad_knob_value_is_printed_once(status):
    """XLKV_STRICT=ture with the flag on: the start-up hook armed the refusal in status's own process, and
    status printed its text in the start-up line and again as a PROBLEM."""
    from xlkv_autopatch import _startup, flag
    from xlkv_autopatch.errors import XlkvFlagError

    env = dict(ENABLE_XLKV="true", XLKV_STRICT="ture")
    os.environ.update(env)
    try:
        assert _startup.arm(XlkvFlagError(flag.knob_error("XLKV_STRICT")), "pth")
    finally:
        for k in env:
            os.environ.pop(k)
    try:
        rc, text = status("0.33.0", **env)
    finally:
        _startup.disarm()
    assert rc == 1 and text.startswith("status: NOT OK (1 problem: the PROBLEM line below)\n"), text
    assert text.count("XLKV_STRICT='ture' is not a value xlkv understands") == 1, text
    assert "this process's start-up hook refused to activate (every import of vLLM raised it; status lifted it to " \
           "look further): XlkvFlagError, as a PROBLEM line below says" in text, text
