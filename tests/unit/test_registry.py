"""Registry behaviour on a fake module tree (pull/push siblings, aliases, classmethod and
property owners, a ClassVar attribute).  Pure logic: no vLLM needed."""

import sys
import types

import pytest

from xlkv_autopatch import registry as R
from xlkv_autopatch.errors import XlkvGuardError, XlkvUnsupportedVersion
from xlkv_autopatch.specs import PatchGroup, PatchSpec

MOD = "fakevllm_xlkv_test.connector"


def build_tree():
    """A fresh module with the shapes vLLM 0.25+ has: base + pull/push + alias."""
    mod = types.ModuleType(MOD)

    class Base:
        prefer_flag = False  # a ClassVar-style attribute (vLLM 0.12-0.13)

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config):
            return "HND"

        @property
        def prefer_cross_layer_blocks(self):
            return False

        def register_kv_caches(self, kv_caches):
            self.seen = kv_caches
            return "base"

    class Pull(Base):
        pass

    class Push(Base):
        def register_kv_caches(self, kv_caches):
            return "push:" + super().register_kv_caches(kv_caches)

    def helper(a, b):
        return a + b

    mod.Base, mod.Pull, mod.Push, mod.Alias, mod.helper = Base, Pull, Push, Pull, helper
    for cls in (Base, Pull, Push):
        cls.__module__ = MOD
    return mod


@pytest.fixture
def tree(monkeypatch):
    mod = build_tree()
    monkeypatch.setitem(sys.modules, MOD, mod)
    return mod


def snapshot(*classes):
    return [dict(vars(c)) for c in classes]


def make_registry(groups, version="0.25.1", active=True):
    """A registry over ``groups``; ``active`` stands for install() having run (no hooks)."""
    reg = R.Registry(lambda: groups, supported=">=0.12,<0.34", version_provider=lambda: version)
    reg.state.active = active
    return reg


def layout_wrapper(wrapped, cls, args, kwargs):
    return ("XL", cls.__name__, wrapped(*args, **kwargs))


def prefer_wrapper(wrapped, instance, args, kwargs):
    return True


def register_wrapper(wrapped, instance, args, kwargs):
    instance.calls = getattr(instance, "calls", 0) + 1
    return "wrapped(" + wrapped(*args, **kwargs) + ")"


def specs(owner="Alias"):
    return (
        PatchSpec("layout", MOD, owner, "get_required_kvcache_layout", "classmethod", layout_wrapper,
                    params=("cls", "vllm_config")),
        PatchSpec("prefer", MOD, owner, "prefer_cross_layer_blocks", "property", prefer_wrapper),
        PatchSpec("register", MOD, owner, "register_kv_caches", "method", register_wrapper,
                    params=("self", "kv_caches")),
    )


def group(patches=None, **kw):
    return PatchGroup("fake", MOD, ">=0.25,<0.34", specs() if patches is None else patches, **kw)


def test_wrapper_lands_on_defining_class_and_siblings_see_it(tree):
    reg = make_registry([group()])
    reg.apply_group(group())
    assert isinstance(vars(tree.Base)["get_required_kvcache_layout"], R.XlkvFunctionWrapper)
    assert "get_required_kvcache_layout" not in vars(tree.Pull)
    # classmethod: the wrapper sees the class it was called on, through alias and sibling
    assert tree.Alias.get_required_kvcache_layout(None) == ("XL", "Pull", "HND")
    assert tree.Push.get_required_kvcache_layout(None) == ("XL", "Push", "HND")
    # property on the base: both pull and push instances see it
    assert tree.Pull().prefer_cross_layer_blocks is True
    assert tree.Push().prefer_cross_layer_blocks is True
    assert isinstance(vars(tree.Base)["prefer_cross_layer_blocks"], R.XlkvProperty)
    # method: push override calls super() -> exactly one wrapper run
    p = tree.Push()
    assert p.register_kv_caches({}) == "push:wrapped(base)"
    assert p.calls == 1


def test_double_install_is_one_wrapper(tree):
    reg = make_registry([group()])
    first = reg.apply_group(group())
    second = reg.apply_group(group())
    assert len(first) == 3 and second == []
    inner = vars(tree.Base)["register_kv_caches"].__wrapped__
    assert not isinstance(inner, R.XlkvFunctionWrapper)
    p = tree.Pull()
    assert p.register_kv_caches({}) == "wrapped(base)" and p.calls == 1


def test_second_registry_sees_existing_wrapper(tree):
    """A fork child or a second trigger path finds the wrapper and adds none."""
    make_registry([group()]).apply_group(group())
    again = make_registry([group()]).apply_group(group())
    assert again == []


def test_uninstall_restores_vars_exactly(tree):
    before = snapshot(tree.Base, tree.Pull, tree.Push)
    reg = make_registry([group()])
    reg.apply_group(group())
    assert snapshot(tree.Base, tree.Pull, tree.Push) != before
    assert reg.uninstall() == 3
    assert snapshot(tree.Base, tree.Pull, tree.Push) == before
    assert tree.Pull.get_required_kvcache_layout(None) == "HND"
    assert tree.Pull().prefer_cross_layer_blocks is False


def test_attribute_override_on_named_class_is_deleted_on_uninstall(tree):
    spec = PatchSpec("flag", MOD, "Pull", "prefer_flag", "attribute",
                       lambda original, instance, owner: owner.__name__ == "Pull" or original,
                       on_named_class=True)
    reg = make_registry([group((spec,))])
    reg.apply_group(group((spec,)))
    assert "prefer_flag" in vars(tree.Pull) and "prefer_flag" not in vars(tree.Push)
    assert tree.Pull.prefer_flag is True and tree.Pull().prefer_flag is True
    assert tree.Push.prefer_flag is False
    reg.uninstall()
    assert "prefer_flag" not in vars(tree.Pull) and tree.Pull.prefer_flag is False


def test_module_function(tree):
    spec = PatchSpec("helper", MOD, None, "helper", "function",
                       lambda w, i, a, k: ("xl", w(*a, **k)), params=("a", "b"))
    reg = make_registry([group((spec,))])
    reg.apply_group(group((spec,)))
    assert tree.helper(1, 2) == ("xl", 3)
    reg.uninstall()
    assert tree.helper(1, 2) == 3


def test_guard_rejects_changed_signature_and_applies_nothing(tree):
    before = snapshot(tree.Base)

    def register_kv_caches(self, kv_caches, extra):
        return "changed"

    tree.Base.register_kv_caches = register_kv_caches
    before = snapshot(tree.Base)
    reg = make_registry([group()])
    with pytest.raises(XlkvGuardError, match=r"has parameters \('self', 'kv_caches', 'extra'\)"):
        reg.apply_group(group())
    # all-or-nothing: the classmethod and property specs resolved fine but were not applied
    assert snapshot(tree.Base) == before
    assert reg.applied() == []


def test_guard_rejects_changed_kind(tree):
    tree.Base.get_required_kvcache_layout = staticmethod(lambda vllm_config: "HND")
    with pytest.raises(XlkvGuardError, match="staticmethod, the patch expects a classmethod"):
        make_registry([group()]).apply_group(group())


def test_missing_attribute_and_class(tree):
    bad = (PatchSpec("nope", MOD, "Alias", "no_such_attr", "method", register_wrapper),)
    with pytest.raises(XlkvGuardError, match="does not exist"):
        make_registry([group(bad)]).apply_group(group(bad))
    bad = (PatchSpec("nope", MOD, "NoSuchClass", "x", "method", register_wrapper),)
    with pytest.raises(XlkvGuardError, match="has no class NoSuchClass"):
        make_registry([group(bad)]).apply_group(group(bad))


def test_failure_midway_reverts_applied_patches(tree):
    before = snapshot(tree.Base)

    class Exploding(PatchSpec):
        pass

    good = specs()[:2]
    # a spec whose holder refuses setattr: a class with a metaclass that raises
    class Meta(type):
        def __setattr__(cls, name, value):
            raise RuntimeError("read-only class")

    class Frozen(metaclass=Meta):
        def register_kv_caches(self, kv_caches):
            return "frozen"

    tree.Frozen = Frozen
    frozen = PatchSpec("frozen", MOD, "Frozen", "register_kv_caches", "method", register_wrapper)
    with pytest.raises(XlkvGuardError, match="could not apply patch set fake"):
        make_registry([group(good + (frozen,))]).apply_group(group(good + (frozen,)))
    assert snapshot(tree.Base) == before


def test_out_of_range_version_raises_documented_error(tree):
    reg = make_registry([group()], version="0.11.2")
    with pytest.raises(XlkvUnsupportedVersion) as e:
        reg.check_version("0.11.2")
    msg = str(e.value)
    assert "vLLM 0.11.2 is not supported" in msg and "unset ENABLE_XLKV" in msg and ">=0.12,<0.34" in msg


def test_install_out_of_range_fails_at_vllm_import(tree, monkeypatch):
    """install() registers a hook on 'vllm'; if vllm is already imported it raises now."""
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    reg = make_registry([group()], version="0.34.0", active=False)
    with pytest.raises(XlkvUnsupportedVersion, match="vLLM 0.34.0 is not supported"):
        reg.install(source="test")


def test_install_hooks_apply_on_import_and_inactive_after_uninstall(tree):
    reg = make_registry([group()], active=False)
    assert reg.install(source="test") is True
    assert reg.install(source="plugin") is False  # second trigger: no new hooks
    assert reg.state.sources == ["test", "plugin"]
    # the trigger module is already in sys.modules: wrapt ran the hook at once
    assert tree.Pull().prefer_cross_layer_blocks is True
    reg.uninstall()
    assert tree.Pull().prefer_cross_layer_blocks is False


@pytest.mark.parametrize("value,patched", [(None, False), ("false", False), ("true", True)])
def test_a_switch_group_is_registered_only_while_its_knob_is_on(tree, monkeypatch, value, patched):
    """A switch that is off wraps nothing (XLKV_DETOK_TAIL's patch set): its hook is never registered, so not
    even a changed target of that set can stop vLLM while the switch is off."""
    if value is None:
        monkeypatch.delenv("XLKV_DETOK_TAIL", raising=False)
    else:
        monkeypatch.setenv("XLKV_DETOK_TAIL", value)
    reg = make_registry([group(knob="XLKV_DETOK_TAIL")], active=False)
    assert reg.install(source="test") is True
    try:
        assert (tree.Pull().prefer_cross_layer_blocks is True) is patched
        assert bool(reg.applied()) is patched
    finally:
        reg.uninstall()


def test_flag_switches_names_every_switch_knob_of_the_patch_sets():
    """flag.SWITCHES (what experiments/upstream's ``switches`` mode turns on) is exactly the knobs of the patch
    sets that are switches, and each is a knob the parser knows."""
    from xlkv_autopatch import flag, patches

    knobs = {how.knob for how in patches.SETS.values() if how.knob}
    assert knobs == set(flag.SWITCHES), (knobs, flag.SWITCHES)
    assert all(name in {k.name for k in flag.KNOBS} for name in flag.SWITCHES)


def test_wrappers_are_inert_when_registry_inactive(tree):
    reg = make_registry([group()])
    reg.apply_group(group())
    reg.state.active = False  # e.g. a stale wrapper after uninstall raced
    assert tree.Pull.get_required_kvcache_layout(None) == "HND"
    reg.state.active = True
    assert tree.Pull.get_required_kvcache_layout(None) == ("XL", "Pull", "HND")


def test_dev_builds_are_gated_before_their_release_and_candidates_as_it():
    from xlkv_autopatch import versions

    assert versions.in_range("0.21.1.dev12+g1234.cu129", ">=0.12,<0.34")
    # setuptools-scm: 0.22.0.devN is main after the 0.21 tag: 0.21's patch set (native-0.20), not 0.22's runner-v1
    from xlkv_autopatch.patches import all_groups
    reg = R.Registry(all_groups)
    names = [g.name for g in reg.groups_for("0.22.0.dev5+g1234")]
    assert "native-0.20" in names and "runner-v1" not in names
    # 0.24.0.devN: below 0.24 yet outside "<0.24" (PEP 440): no patch set, refused with the way out
    with pytest.raises(XlkvUnsupportedVersion, match="development build.*XLKV_VLLM_VERSION"):
        reg.check_version("0.24.0.dev5+g1234")
    assert versions.in_range("0.21.0+cu129", ">=0.21,<0.22")
    assert not versions.in_range("0.34.0.dev3", ">=0.12,<0.34")
    assert not versions.in_range("0.11.2", ">=0.12,<0.34")
    assert not versions.in_range("garbage", ">=0.12,<0.34")
    assert versions.in_range("0.33.0rc1", ">=0.33,<0.34")


def test_version_override(monkeypatch):
    from xlkv_autopatch import versions

    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.21.0")
    assert versions.vllm_version() == "0.21.0"


def test_unknown_kind_rejected():
    with pytest.raises(ValueError):
        PatchSpec("x", MOD, "A", "b", "slot", register_wrapper)


def test_factory_guard_refuses_a_nixl_connector_the_patches_did_not_reach(tree, monkeypatch):
    """The invariant of patches/kv_connector_factory.py, on the fake tree: a NIXL connector
    created while this release's NIXL patch set is not applied stops with the cause."""
    from xlkv_autopatch.errors import XlkvNotAttachedError
    from xlkv_autopatch.patches import kv_connector_factory as guard

    class NixlConnector(tree.Pull):  # what vLLM's factory would create
        pass

    waiting = PatchGroup("waits-for-a-missing-module", "fakevllm_xlkv_test.gone", ">=0.25,<0.34", specs())
    reg = make_registry([group(), waiting])
    reg.state.version = "0.25.1"
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.25.1")
    with pytest.raises(XlkvNotAttachedError) as e:
        guard.check(NixlConnector(), reg)
    msg = str(e.value)
    assert "no xlkv wrapper on" in msg and "patch set fake (for vLLM >=0.25,<0.34) did not attach" in msg
    assert "fakevllm_xlkv_test.gone was never imported" in msg and "unset XLKV_VLLM_VERSION" in msg
    reg.apply_group(group())
    with pytest.raises(XlkvNotAttachedError, match="waits-for-a-missing-module"):
        guard.check(NixlConnector(), reg)  # wrappers in place, but a set of this release is missing
    reg = make_registry([group()])
    reg.state.version = "0.25.1"
    reg.apply_group(group())
    guard.check(NixlConnector(), reg)  # everything in place: no complaint
    guard.check(object(), make_registry([waiting]))  # not a NIXL connector: not checked


@pytest.fixture
def installed_vllm(tmp_path, monkeypatch):
    """Package metadata of an installed vLLM (no code), as importlib.metadata finds it."""
    def install(version):
        d = tmp_path / ("vllm-%s.dist-info" % version)
        d.mkdir()
        (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: %s\n" % version)
        monkeypatch.syspath_prepend(str(tmp_path))
    return install


def test_refusals_name_the_override_both_versions_and_unsetting_it(tree, monkeypatch, installed_vllm):
    """With XLKV_VLLM_VERSION naming another release than the installed one, the
    refusal said "install a vLLM release in >=0.12,<0.34" and never mentioned the override."""
    installed_vllm("0.33.0")
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.21.0")
    bad = (PatchSpec("nope", MOD, "Alias", "no_such_attr", "method", register_wrapper),)
    reg = make_registry([group(bad)], version="0.21.0")
    reg.state.version = "0.21.0"
    with pytest.raises(XlkvGuardError) as e:
        reg.apply_group(group(bad))
    for msg in (str(e.value), str(pytest.raises(XlkvUnsupportedVersion, reg.check_version, "0.11.2").value)):
        assert "XLKV_VLLM_VERSION=" in msg and "the installed package says vLLM 0.33.0" in msg, msg
        assert "Fix: unset XLKV_VLLM_VERSION" in msg and "install a vLLM release" not in msg, msg
    monkeypatch.setenv("XLKV_VLLM_VERSION", "garbage")
    with pytest.raises(XlkvUnsupportedVersion, match="'garbage' is not a vLLM version number .it comes from "
                                                     "XLKV_VLLM_VERSION.*Fix: unset XLKV_VLLM_VERSION"):
        reg.check_version("garbage")
    # the override naming the installed release, or none: the usual fix
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.33.0")
    with pytest.raises(XlkvUnsupportedVersion, match=r"install a vLLM release in >=0.12,<0.34$"):
        reg.check_version("0.11.2")


def test_a_refused_precheck_keeps_its_own_fix_and_the_guard_repeats_it(tree):
    """The kvcached refusal ended with "install a vLLM release in ...", and after a
    caller caught it the connector guard blamed a trigger module "never imported" and a fork."""
    from xlkv_autopatch.errors import XlkvError
    from xlkv_autopatch.patches import kv_connector_factory as guard

    def conflict():
        raise XlkvError("xlkv_autopatch: ENABLE_KVCACHED and ENABLE_XLKV are both set: ... Fix: unset ENABLE_XLKV")

    g = group(precheck=conflict)
    reg = make_registry([g])
    reg.state.version = "0.25.1"
    with pytest.raises(XlkvError) as e:
        reg.apply_group(g)
    assert str(e.value).startswith("xlkv_autopatch: ENABLE_KVCACHED and ENABLE_XLKV are both set")
    assert "install a vLLM release" not in str(e.value)

    class NixlConnector(tree.Pull):
        pass

    with pytest.raises(XlkvError) as again:  # the caller caught it; vLLM goes on to make a connector
        guard.check(NixlConnector(), reg)
    msg = str(again.value)
    assert "ENABLE_KVCACHED and ENABLE_XLKV are both set" in msg and "repeated" in msg
    assert "never imported" not in msg and "fork" not in msg


def test_a_patch_set_applied_says_which_knob_does_nothing_in_this_process(tree, monkeypatch, caplog):
    """After a patch set is applied the registry asks again which knob does nothing here: NVIDIA Dynamo's vLLM worker
    is known only once it imports vLLM (start-up came before), and there XLKV_DETOK_TAIL does nothing."""
    import types
    from xlkv_autopatch import facts, logs

    monkeypatch.setattr(logs, "_seen", set())
    monkeypatch.setenv("XLKV_DETOK_TAIL", "true")
    monkeypatch.setenv("XLKV_VLLM_VERSION", "0.33.0")
    monkeypatch.setitem(sys.modules, "dynamo.vllm", types.ModuleType("dynamo.vllm"))
    facts.reset()
    reg = make_registry([group()])
    try:
        with caplog.at_level("WARNING", logger="vllm.xlkv_autopatch"):
            assert reg.install(source="test") is True
        assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
            "xlkv_autopatch: XLKV_DETOK_TAIL is set, but " + facts.DYNAMO_DETOK]
    finally:
        reg.uninstall()
        facts.reset()
