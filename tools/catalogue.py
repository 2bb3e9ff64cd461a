"""The tables docs/mechanism.md shows about releases, rendered from the release table.

:func:`render_mechanisms`: which mechanism applies to which releases (and which are refused);
:func:`render`: the patch catalogue, every vLLM attribute the shim wraps, in which releases and
where, from :func:`xlkv_autopatch.patches.all_groups` (itself derived from
:mod:`xlkv_autopatch.releases`).  Never written by hand: docs/mechanism.md carries them between
the markers of :data:`BLOCKS`; ``python3 tools/catalogue.py --write`` rewrites them and
tests/unit/test_structure.py fails on a stale one.  A docs renderer, not part of the package (it
ships in no wheel): it reads the package's release table and patch groups.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # a checkout run: python3 tools/catalogue.py
    sys.path.append(ROOT)
from xlkv_autopatch import patches, releases, versions  # noqa: E402

START = "<!-- patch catalogue: python3 tools/catalogue.py --write renders it from the release table -->"
END = "<!-- end of the patch catalogue -->"
MECH_START = "<!-- mechanisms: python3 tools/catalogue.py --write renders it from the release table -->"
MECH_END = "<!-- end of the mechanisms -->"

#: (mechanism, runner_v1[, packed_groups]) of a run of release-table rows -> (name, what the shim changes there)
MECHANISM_TEXT = {
    ("backport", False): (
        "backport", "`NixlConnector.prefer_cross_layer_blocks` (upstream guards: FLASH_ATTN/FLASHINFER, HND, one KV "
        "group, no MLA/Mamba) and `register_cross_layers_kv_cache` (a no-op upstream) redirected to the worker's "
        "`register_kv_caches` with a zero-copy view of the cross-layer tensor"),
    ("native", False): (
        "native opt-in", "`prefer_cross_layer_blocks` evaluated as if `enable_cross_layers_blocks` were set "
        "(upstream's own guards, no config edit)"),
    ("native", True): (
        "native opt-in + V1 runner", "as above, plus `VllmConfig.use_v2_model_runner` → V1 for NIXL engines "
        "(Model Runner V2 silently ignores cross-layer blocks)"),
    ("native", True, True): (
        "native opt-in + V1 runner + packed KV cache groups", "as above, plus `kv_cache_utils._use_packed_kv_cache_"
        "config` → True for sliding-window hybrids with several KV cache groups where `XLKV_EQUAL_TP=true` (vLLM's "
        "packed multi-group allocation, one region per block id; the hash tagged, heterogeneous TP refused); without "
        "the knob they keep the stock layout (INFO line) and any TP pairing is served"),
    ("layout", False): (
        "KV-cache layout", "`NixlConnector.get_required_kvcache_layout` → `BHLNC` (block outermost, KV heads "
        "outermost inside the row: one whole-row region per block, a rank's heads one range of it), `BLNHC` for MLA; "
        "`NixlConnector.register_kv_caches` has vLLM register the row as one region at one KV head per rank and checks "
        "the heads tile it; `KVCacheLayout.is_block_contiguous` answers True for those `BHLNC` rows inside the "
        "handshake only, so vLLM's heterogeneous-TP head slicing serves them; an explicit `VLLM_KV_CACHE_LAYOUT` "
        "wins"),
}
DOC = os.path.join(ROOT, "docs", "mechanism.md")
_PREFIX = "vllm.distributed.kv_transfer.kv_connector."


def _releases_text(rels):
    """"0.12–0.19, 0.24" for table releases, consecutive rows joined."""
    order = [r.release for r in releases.RELEASES]
    idx = sorted(order.index(r) for r in set(rels))
    runs = []
    for i in idx:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(order[a] if a == b else "%s–%s" % (order[a], order[b]) for a, b in runs)


def entries():
    """[(file, attribute, releases text, where text)] in the order the groups first declare them;
    attributes attached at run time (:data:`patches.INSTANCE_PATCHES`) last."""
    groups = patches.all_groups()
    seen = {}  # (file, attr) -> {"rels": [...], "where": [(owner, module, release)], "always": bool}
    by_spec = {}  # spec name -> releases
    for g in groups:
        rows = list(releases.RELEASES) if g.always else [
            r for r in releases.RELEASES if versions.in_range(r.release + ".0", g.vllm)]
        for s in g.patches:
            e = seen.setdefault((s.name.split(".")[0], s.attr), {"rels": [], "where": [], "always": g.always})
            for r in rows:
                e["rels"].append(r.release)
                e["where"].append((s.owner or s.attr, s.module, r.release))
                by_spec.setdefault(s.name, []).append(r.release)
    files = list(dict.fromkeys(fname for fname, _ in seen))
    out = []
    for (fname, attr), e in sorted(seen.items(), key=lambda kv: files.index(kv[0][0])):  # stable: attrs in order
        where = {}
        for owner, module, rel in e["where"]:
            where.setdefault(owner, {}).setdefault(module, []).append(rel)
        text = "; ".join("%s: %s" % ("module function" if owner == attr else "`%s`" % owner, ", ".join(
            "`%s` %s" % (module.replace(_PREFIX, ""), "(all)" if e["always"] else _releases_text(rels))
            for module, rels in modules.items())) for owner, modules in where.items())
        out.append((fname, attr, "all" if e["always"] else _releases_text(e["rels"]), text))
    for (fname, attr, what), spec in patches.INSTANCE_PATCHES.items():
        out.append((fname, attr, _releases_text(by_spec[spec]), "%s, attached by `%s`" % (what, spec)))
    return out


def render():
    lines = ["| file | attribute | vLLM releases | where: class, module (`v1.…` and `factory` are under `%s`) |"
             % _PREFIX.rstrip("."), "|---|---|---|---|"]
    for fname, attr, rels, where in entries():
        lines.append("| `%s` | `%s` | %s | %s |" % (fname, attr, rels, where))
    return "\n".join(lines)


def render_mechanisms():
    """Which mechanism applies to which releases: runs of rows with the same (mechanism, runner_v1, packed_groups),
    after a first line for the releases the shim refuses."""
    rows = releases.RELEASES
    major, first = releases.minor(rows[0].release)
    lines = ["| vLLM | mechanism | what the shim changes |", "|---|---|---|",
             "| %d.%d.x and older, %s+ | — | refuses to start with `ENABLE_XLKV` set (unsupported release) |"
             % (major, first - 1, releases.span(rows[-1], rows[-1]).split("<")[1])]
    for run in releases.runs(lambda r: (r.mechanism, r.runner_v1, r.packed_groups)):
        key = (run[0].mechanism, run[0].runner_v1) + ((True,) if run[0].packed_groups else ())
        name, what = MECHANISM_TEXT[key]
        rels = run[0].release if len(run) == 1 else "%s–%s" % (run[0].release, run[-1].release)
        lines.append("| %s | %s | %s |" % (rels, name, what))
    return "\n".join(lines)


#: (start marker, end marker, renderer) of each block in docs/mechanism.md
BLOCKS = ((MECH_START, MECH_END, render_mechanisms), (START, END, render))


def rendered_in(text, start=START, end=END):
    """The block between the markers ``start`` and ``end`` of ``text`` (docs/mechanism.md), or None."""
    if start not in text or end not in text:
        return None
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def write(path=DOC):
    text = open(path).read()
    for start, end, renderer in BLOCKS:
        if rendered_in(text, start, end) is None:
            raise SystemExit("%s has no markers %s ... %s" % (path, start, end))
        head, rest = text.split(start, 1)
        text = "%s%s\n%s\n%s%s" % (head, start, renderer(), end, rest.split(end, 1)[1])
    with open(path, "w") as f:
        f.write(text)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--write"]:
        write()
        return 0
    print(render_mechanisms())
    print()
    print(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
