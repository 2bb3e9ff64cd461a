"""``python -m xlkv_autopatch status --model DIR``: what the shim will do for one model on the
installed vLLM, before anything is served.

The model's shape is :func:`xlkv_autopatch.families.classify` of its config, with MLA, Mamba and the
KV heads from vLLM's own ``ModelConfig`` for the folder where vLLM can build one (exactly as the
engine classifies the model), else from ``config.json`` alone (said so in the output); the decision
is :func:`xlkv_autopatch.families.decide`, the function every patch asks at run time.
"""

import json
import os
from dataclasses import replace

from . import facts, families, flag, layout


def _read_config(path):
    with open(os.path.join(path, "config.json")) as f:
        return families.text_config(json.load(f))  # multimodal wrappers keep the language model's fields there


def _from_vllm(path):
    """(use_mla, is_hybrid, total KV heads, hf_text_config) from vLLM's ModelConfig, or raise."""
    from vllm.config import ModelConfig

    model = ModelConfig(model=path, tokenizer=path, skip_tokenizer_init=True)
    return (bool(model.use_mla), bool(model.is_hybrid), model.get_total_num_kv_heads(),
            getattr(model, "hf_text_config", None) or model.hf_config)


def pair(path, *, prefill_tp, decode_tp, pp=1, use_vllm=True, block_size=None, kernel_block_size=None,
         prefill_block_size=None):
    """What a prefill/decode pair at these TP sizes gets: each side's decision (collect), whether the
    pair is served with ENABLE_XLKV on both, and the descriptors per block that each decode rank
    reads from each remote prefill rank (before NIXL merges neighbours).  ``prefill_block_size``: the
    prefill engine's --block-size where it differs from decode's (``block_size``): the handshake's
    answer, layout.block_sizes_served."""
    sizes = dict(block_size=block_size, kernel_block_size=kernel_block_size)
    sides = {"prefill": collect(path, tp=prefill_tp, pp=pp, use_vllm=use_vllm,
                                **dict(sizes, block_size=prefill_block_size or block_size)),
             "decode": collect(path, tp=decode_tp, pp=pp, use_vllm=use_vllm, **sizes)}
    out = {"prefill_tp": prefill_tp, "decode_tp": decode_tp, "sides": sides}
    out = _with_block_sizes(_pair(out, sides, prefill_tp, decode_tp), sides, prefill_tp, decode_tp)
    return out


def _pair(out, sides, prefill_tp, decode_tp):
    if any(side.get("error") for side in sides.values()):
        out["error"] = sides["prefill"].get("error") or sides["decode"].get("error")
        return out
    p, d = sides["prefill"], sides["decode"]
    replicated = d["attention"] in families.REPLICATED
    sources, refused = layout.remote_sources(prefill_tp=prefill_tp, decode_tp=decode_tp, kv_heads=d["kv_heads"],
                                             replicated=replicated)
    out["remote_ranks_per_decode_rank"] = sources
    stock = d["descriptors_per_block"]["stock"]
    if refused:
        out.update(served=False, reason=refused, descriptors_per_block_per_remote_rank={"stock": None, "xlkv": None})
        return out
    release = facts.current()
    if p["layout"] != d["layout"]:
        served, reason, xlkv = False, ("prefill gets %s, decode %s: the handshake is refused (%s / %s)" % (
            p["layout"], d["layout"], p["reason"], d["reason"])), None
    elif prefill_tp == decode_tp or not d["cross_layer"]:
        served, xlkv = True, d["descriptors_per_block"]["xlkv"]
        reason = "the same layout on both sides" if d["cross_layer"] else \
            "both sides keep the stock layout: %s" % d["reason"]
    elif release.mechanism == "layout" or replicated:   # 0.29+ rows; 0.26-0.28 MLA: one latent tensor on every rank
        tp = layout.pair_served(release, local_tp=decode_tp, remote_tp=prefill_tp, replicated=replicated,
                                heads_outermost_rows=d["layout"] == layout.HEADS_OUTERMOST_LAYOUT)
        served, xlkv = tp.use, 1 if tp.use else None
        reason = tp.reason if tp.use else "the handshake is refused: %s" % tp.reason
    else:  # 0.12-0.28, cross-layer blocks: FLASH_ATTN's keep the heads outermost where the release says so
        fa = layout.pair_served(release, local_tp=decode_tp, remote_tp=prefill_tp, backend="FLASH_ATTN",
                                packed_groups=d["layout"] == "packed KV cache groups")
        served, xlkv = fa.use, 1 if fa.use else None
        others = ("the handshake is refused with %s=true (set on this pair); unset, they keep the stock layout and "
                  "are served as stock" % layout.EQUAL_TP_KNOB) if _equal_tp() else "the stock layout, served as stock"
        reason = ("with FLASH_ATTN: %s; other attention backends: %s" % (fa.reason, others)) if fa.use else (
            "the handshake is refused: %s (%s=true is set; unset, this engine keeps the stock layout and the pair "
            "is served as stock)" % (fa.reason, layout.EQUAL_TP_KNOB))
    out.update(served=served, reason=reason,
               descriptors_per_block_per_remote_rank={"stock": stock, "xlkv": xlkv})
    return out


def _with_block_sizes(out, sides, prefill_tp, decode_tp):
    """A pair whose engines' blocks hold different token counts: layout.block_sizes_served, the answer the
    decode side's handshake gives (with the receive restage attached, as it is wherever the shim runs; a
    padded row, which status cannot see, is refused at the handshake with that cause)."""
    p, d = sides["prefill"], sides["decode"]
    if out.get("error") or p.get("block_size") == d.get("block_size"):
        return out
    out.update(prefill_block_size=p["block_size"], decode_block_size=d["block_size"])
    if not out.get("served"):
        return out
    release = facts.current()
    per = out["descriptors_per_block_per_remote_rank"]
    if not d["cross_layer"]:  # both stock: vLLM's own rule (its receive reorders per layer)
        ratio, rest = divmod(d["block_size"], p["block_size"])
        if rest or prefill_tp > decode_tp:
            out.update(served=False, reason="vLLM refuses %d-token prefill blocks with %d-token decode blocks here, "
                       "with or without xlkv" % (p["block_size"], d["block_size"]),
                       descriptors_per_block_per_remote_rank={"stock": None, "xlkv": None})
        else:
            out["descriptors_per_block_per_remote_rank"] = {k: None if n is None else n * ratio for k, n in per.items()}
        return out
    decision, ratio = layout.block_sizes_served(
        release, local_block_size=d["block_size"], remote_block_size=p["block_size"], local_tp=decode_tp,
        remote_tp=prefill_tp, mla=d["attention"] in families.REPLICATED,
        sliding_window=d["attention"] == families.SLIDING_WINDOW,
        heads_outermost_rows=d["layout"] == layout.HEADS_OUTERMOST_LAYOUT)
    if not decision.use:
        out.update(served=False, reason="the handshake is refused: %s" % decision.reason,
                   descriptors_per_block_per_remote_rank={"stock": None, "xlkv": None})
        return out
    stock = per["stock"]
    out.update(reason="%s; %s" % (out["reason"], decision.reason),
               descriptors_per_block_per_remote_rank={"stock": None if stock is None else stock * ratio,
                                                      "xlkv": ratio})
    return out


def _equal_tp():
    """XLKV_EQUAL_TP as the engines would read it (an unrecognised value is status's own problem line)."""
    return flag.knob_state(layout.EQUAL_TP_KNOB) == "on"


def render_pair(info):
    if info.get("error"):
        return ["model: %s" % info["error"]]
    count = lambda n: "?" if n is None else str(n)  # noqa: E731
    d = info["descriptors_per_block_per_remote_rank"]
    sizes = (", %d-token -> %d-token blocks" % (info["prefill_block_size"], info["decode_block_size"])
             if info.get("prefill_block_size") else "")
    lines = ["pair: prefill TP %d -> decode TP %d%s: %s -- %s" % (info["prefill_tp"], info["decode_tp"], sizes,
                                                                    "served" if info["served"] else "REFUSED",
                                                                    info["reason"])]
    for name in ("prefill", "decode"):
        side = info["sides"][name]
        lines.append("  %s (TP %d, %s): %s" % (name, side["tp"], per_rank(side), side["layout"]))
    if info["served"]:
        lines.append("  each decode rank reads %s prefill rank(s); NIXL descriptors per block per remote rank (before "
                     "NIXL merges neighbours): stock %s, xlkv %s" % (count(info["remote_ranks_per_decode_rank"]),
                                                                   count(d["stock"]), count(d["xlkv"])))
    return lines


def per_rank(side):
    """What one TP rank holds of the KV cache, as vLLM registers it: its share of the KV heads, or (MLA) the
    one latent KV cache every rank holds whole."""
    if side.get("attention") in families.REPLICATED:
        return "the latent KV cache replicated on every rank"
    n = side.get("kv_heads_per_rank")
    return "%s KV head%s per rank" % ("?" if n is None else n, "" if n == 1 else "s")


def collect(path, *, tp=1, pp=1, use_vllm=True, block_size=None, kernel_block_size=None):
    """The decision for the model in folder ``path`` at tensor/pipeline parallel sizes tp/pp (``block_size``:
    vLLM's --block-size, ``kernel_block_size``: the attention kernel's block, where the caller knows it)."""
    out = {"dir": path, "tp": tp, "pp": pp, "notes": []}
    try:
        cfg = _read_config(path)
    except (OSError, ValueError) as e:
        out["error"] = "cannot read %s: %s" % (os.path.join(path, "config.json"), e)
        return out
    config, source = cfg, "config.json"
    # vLLM's switch that serves an MLA model without MLA (its own ModelConfig reads it too)
    engine = dict(use_mla=False if os.environ.get("VLLM_MLA_DISABLE", "0") not in ("", "0") else None)
    if use_vllm:
        try:
            use_mla, hybrid, heads, config = _from_vllm(path)
            engine, source = dict(use_mla=use_mla, mamba=hybrid, kv_heads=heads), "vLLM's ModelConfig"
        except Exception as e:  # report, never crash status
            out["notes"].append("vLLM could not load the config (%s: %s); read from config.json alone"
                                % (type(e).__name__, str(e).splitlines()[0][:200] if str(e) else ""))
    shape = families.classify(config, tp=tp, pp=pp, source=source, **engine)
    release = facts.current()
    layers = config.get("num_hidden_layers") if isinstance(config, dict) else getattr(config, "num_hidden_layers", None)
    if shape.attention == families.SLIDING_WINDOW and release.connector_turns_hma_off and isinstance(layers, int):
        # vLLM 0.12-0.21 turn the hybrid KV cache manager off under any KV connector: one KV cache group
        shape = replace(shape, kv_cache_groups=1, group_layers=layers)
        out["notes"].append("this vLLM turns its hybrid KV cache manager off under a KV connector, so the "
                            "sliding-window and full-attention layers share one KV cache group (with "
                            "--no-disable-hybrid-kv-cache-manager they would not, and the stock layout is kept)")
    equal_tp = _equal_tp()
    decision = families.decide(shape, release, equal_tp=equal_tp)
    kept = {}  # backend -> why it keeps the stock layout (None: cross-layer), where the backend decides too
    if decision.cross_layer and release.mechanism != "layout" and shape.attention != families.MLA:
        # the attention backend decides too (the preference patch asks the same function at run time)
        kept = {b: families.kept_stock_for_any_tp(b, release, equal_tp=equal_tp)
                for b in release.cross_layer_backends}
        others = [b for b in release.cross_layer_backends if kept[b] and b != "FLASH_ATTN"]
        if kept.get("FLASH_ATTN"):  # 0.23-0.25: no backend's cross-layer block keeps the heads outermost
            decision = replace(decision, cross_layer=False, for_any_tp=True, reason=kept["FLASH_ATTN"])
        if others:
            out["notes"].append(("other attention backends (%s) keep the stock layout too: %s" if kept.get("FLASH_ATTN")
                                 else "with FLASH_ATTN; other attention backends (%s) keep the stock layout: %s")
                                % (", ".join(others), kept[others[0]]))
    env_layout = os.environ.get("VLLM_KV_CACHE_LAYOUT")
    rel = "%d.%d" % release.release[:2]
    invalid = layout.invalid_layout_value(env_layout, mechanism=release.mechanism, release=rel)
    explicit = layout.explicit_layout(env_layout) if release.mechanism == "layout" and not invalid else None
    if invalid:  # vLLM itself stops at start-up (status's PROBLEM line says why): no layout runs
        out["stops"] = "vLLM %s stops at start-up: VLLM_KV_CACHE_LAYOUT=%r is not a value it accepts" % (
            rel, env_layout)
    if explicit is not None:  # vLLM reads it before asking the connector: it decides
        decision = replace(decision, cross_layer=explicit.use and decision.cross_layer, reason=explicit.reason,
                           layout=layout.layout_name(env_layout))
        out["explicit_layout"] = True
    block = block_size or DEFAULT_BLOCK_SIZE
    kernel_ratio = 1
    if decision.cross_layer and kernel_block_size and kernel_block_size < block:
        if release.mechanism == "layout":  # the same rule the layout patch applies at start-up (a WARNING there)
            decision = replace(decision, cross_layer=False, for_any_tp=False, layout=None,
                               reason=layout.kernel_split_reason(kernel_block_size, block))
        elif block % kernel_block_size == 0:  # 0.12-0.28: one descriptor per kernel block
            kernel_ratio = block // kernel_block_size
    elif decision.cross_layer and release.mechanism == "layout" and not kernel_block_size and not invalid:
        out["notes"].append("assumes the attention kernel block is the KV block (%d tokens): where the attention "
                            "backend vLLM picks splits it into smaller kernel blocks, the engine keeps the stock layout "
                            "(a WARNING at start-up). status cannot know the backend's kernel block before vLLM picks "
                            "it: --kernel-block-size N says what then runs" % block)
    stock, xlkv = families.expected_descriptors(shape, decision, kv_split_regions=release.kv_split_regions)
    if invalid:
        stock = xlkv = None  # nothing is registered: no engine starts
    if kernel_ratio > 1 and isinstance(xlkv, int):
        xlkv *= kernel_ratio
        out["notes"].append("the attention kernel block (%d tokens) splits each %d-token KV block: one descriptor per "
                            "kernel block" % (kernel_block_size, block))
    by_backend = None
    if kept and decision.cross_layer:
        # 0.12-0.25: a blocks-first backend's cross-layer block keeps K and V apart (2 regions)
        by_backend = {b: stock if kept[b] else layout.cross_layer_regions(
            backend=b, replicated=shape.replicated, kv_split_regions=release.kv_split_regions)
                      for b in release.cross_layer_backends}
        if len({n for b, n in by_backend.items() if not kept[b]}) > 1:  # (kept ones have their own note)
            out["notes"].append("NIXL descriptors per block id depend on the attention backend vLLM picks: %s"
                                % ", ".join("%s %s" % kv for kv in by_backend.items()))
    out.update({
        "block_size": block,
        "kernel_block_size": kernel_block_size,
        "source": source,
        "family": decision.family,
        "attention": shape.attention,
        "title": decision.title,
        "cross_layer": decision.cross_layer,
        "reason": decision.reason,
        "layout": "none (vLLM stops at start-up)" if invalid else _layout_name(release, decision),
        "kv_heads_per_rank": shape.kv_heads_per_rank,
        "kv_heads": shape.kv_heads,
        "attention_layers_per_block_id": shape.group_layers,
        "descriptors_per_block": {"stock": stock, "xlkv": xlkv},
        "descriptors_per_block_by_backend": by_backend,
    })
    return out


#: vLLM's default --block-size (CacheConfig.block_size), which status --block-size stands for when not given
DEFAULT_BLOCK_SIZE = 16


def _layout_name(release, decision):
    if not decision.cross_layer:
        return "stock" if decision.layout is None else "stock (%s)" % decision.layout
    if release.mechanism == "layout":
        return decision.layout
    if decision.family == families.SLIDING_WINDOW and release.packed_groups:
        return "packed KV cache groups"
    return "one cross-layer KV tensor"


def problems(info, strict):
    """Start-up refusals this model causes: with XLKV_STRICT=1 a stock family is an error."""
    if info.get("error"):
        return [info["error"]]
    if info.get("stops") or info.get("explicit_layout"):
        return []  # status's own PROBLEM or NOTE names VLLM_KV_CACHE_LAYOUT (once)
    if strict and not info["cross_layer"]:
        return ["XLKV_STRICT=1 and this model keeps the stock layout (%s): vLLM stops at start-up. Fix: unset "
                "XLKV_STRICT to serve it with the stock layout" % info["reason"]]
    return []


def start_up_stop(info, strict):
    """Why the engine of side ``info`` does not start (None: it starts): vLLM refuses VLLM_KV_CACHE_LAYOUT, or
    XLKV_STRICT=1 turns its kept stock layout into an error."""
    if info.get("error"):
        return None
    if info.get("stops"):
        return info["stops"]
    if strict and not info["cross_layer"]:
        return "XLKV_STRICT=1 turns its kept stock layout into an error at start-up (%s)" % info["reason"]
    return None


def render(info):
    if info.get("error"):
        return ["model %s: %s" % (info["dir"], info["error"])]
    d = info["descriptors_per_block"]
    count = lambda n: "?" if n is None else str(n)  # noqa: E731
    lines = ["model %s (TP %d, PP %d; facts from %s): %s" % (info["dir"], info["tp"], info["pp"], info["source"],
                                                              info["title"]),
             "  with ENABLE_XLKV=true: %s" % ("nothing runs: %s" % info["stops"] if info.get("stops") else
                                              "%s -- %s" % (info["layout"], info["reason"])),
             ] + ([] if info.get("stops") else [
                 "  NIXL descriptors per block id (one KV cache group, before NIXL merges neighbours): stock %s, "
                 "xlkv %s" % (count(d["stock"]), count(d["xlkv"]))])
    lines += ["  NOTE: %s" % n for n in info["notes"]]
    return lines
