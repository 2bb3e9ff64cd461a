"""vLLM's KV-transfer metrics: the "KV Transfer metrics" log lines, the Prometheus NIXL
counters, and the descriptor-per-block arithmetic.

* ``vllm/distributed/kv_transfer/kv_connector/v1/metrics.py`` logs
  ``"KV Transfer metrics: %s"`` with ``", ".join(f"{k}={v}" ...)`` of
  ``NixlKVConnectorStats.reduce()`` (``.../nixl/stats.py``): Num successful transfers,
  Avg/P90 xfer time (ms), Avg/P90 post time (ms), Avg MB per transfer (MiB, 2**20),
  Throughput (MB/s), Avg number of descriptors.  The line is printed by the decode
  instance (the side that reads) once per ``VLLM_LOG_STATS_INTERVAL`` with the transfers
  of that interval only, so a run's numbers are the transfer-weighted mean of its lines.
* Blocks per transfer are not logged.  They follow from the bytes and what D registered: the
  registration report (experiments/negative_control/, ``XLKV_REGISTRATION_REPORT``) gives, per
  KV cache group, the bytes one block id of that group moves (the block lengths of the regions
  it touches: MLA's latent pages, several groups of a sliding-window hybrid, whole block rows).
  Descriptors per block id = (avg descriptors per transfer) / (avg block ids per transfer).  A
  sliding-window group sends only its in-window tail, so a transfer's block ids differ per group;
  that is exact as long as every group's block id moves the same bytes (the hybrid allocator
  makes their pages equal); otherwise the blocks are not derived (None, said in a note).
  Without a report, and only for a dense model, the formula ``block_size * layers * 2 (K,V) *
  kv_heads * head_dim * dtype_bytes`` (1.75 MiB for the Qwen3-0.6B shape at block 16, divided
  over tensor-parallel ranks) stands in, with a note.
* The same counters exist as Prometheus histograms on the decode instance:
  ``vllm:nixl_num_descriptors`` and ``vllm:nixl_bytes_transferred`` (``_sum``/``_count``).
"""

import dataclasses
import json
import math
import os
import re

import model_shapes  # the lab's table of model shapes (experiments/, the folder above this package)

from .gates import shim

KV_LINE_RE = re.compile(r"KV Transfer metrics: (.*)$")
# Keys are free text with spaces and parentheses; values are numbers. Split on ", " that
# is followed by a key and "=".
_KV_PAIR_RE = re.compile(r"\s*([^=,][^=]*?)=([-+0-9.eEinfaN]+)\s*(?:,|$)")

KEY_N = "Num successful transfers"
KEY_XFER = "Avg xfer time (ms)"
KEY_P90 = "P90 xfer time (ms)"
KEY_POST = "Avg post time (ms)"
KEY_MB = "Avg MB per transfer"
KEY_TPUT = "Throughput (MB/s)"
KEY_DESC = "Avg number of descriptors"


def parse_kv_line(line):
    """Dict of the numbers in one "KV Transfer metrics:" line, or None if it is not one."""
    m = KV_LINE_RE.search(line.rstrip("\n"))
    if not m:
        return None
    out = {}
    for k, v in _KV_PAIR_RE.findall(m.group(1)):
        try:
            num = float(v)
        except ValueError:
            continue
        out[k.strip()] = int(num) if num.is_integer() and k.strip() == KEY_N else num
    return out if KEY_N in out else None


def read_kv_lines(path, offset=0):
    """Parsed KV metrics lines of a log file, from byte ``offset`` on."""
    rows = []
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            rec = parse_kv_line(raw.decode("utf-8", errors="replace"))
            if rec is not None:
                rows.append(rec)
    return rows


def aggregate_kv(rows):
    """Transfer-weighted aggregate of several interval lines (one benchmark run)."""
    rows = [r for r in rows if r.get(KEY_N, 0) > 0]
    n = sum(r[KEY_N] for r in rows)
    if n == 0:
        return {"num_transfers": 0, "lines": len(rows)}

    def wmean(key):
        vals = [(r[KEY_N], r[key]) for r in rows if key in r]
        tot = sum(w for w, _ in vals)
        return sum(w * v for w, v in vals) / tot if tot else None

    avg_mb = wmean(KEY_MB)
    avg_xfer = wmean(KEY_XFER)
    return {
        "num_transfers": n,
        "lines": len(rows),
        "avg_descriptors_per_transfer": wmean(KEY_DESC),
        "avg_mb_per_transfer": avg_mb,
        "avg_xfer_ms": avg_xfer,
        "max_p90_xfer_ms": max((r[KEY_P90] for r in rows if KEY_P90 in r), default=None),
        "avg_post_ms": wmean(KEY_POST),
        # total MiB over total transfer time, like vLLM's own Throughput field
        "throughput_mb_s": (avg_mb / (avg_xfer / 1e3)) if avg_mb and avg_xfer else None,
    }


_PROM_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaN]+)")
PROM_KEYS = {
    "vllm:nixl_num_descriptors_sum": "descriptors_sum",
    "vllm:nixl_num_descriptors_count": "transfers",
    "vllm:nixl_bytes_transferred_sum": "bytes_sum",
    "vllm:nixl_xfer_time_seconds_sum": "xfer_seconds_sum",
    "vllm:nixl_num_failed_transfers_total": "failed_transfers",
}
#: vLLM's own per-request histograms at D (sum and count, seconds): the handoff's parts inside D.
#: time_to_first_token: the request's arrival at D -> its first token; request_queue_time: queued
#: in D's engine -> first scheduled (blocks allocated, the KV read posted); request_prefill_time:
#: first scheduled -> first token (the read, its completion noticed, the last token computed)
REQUEST_KEYS = {
    "vllm:time_to_first_token_seconds": "d_ttft",
    "vllm:request_queue_time_seconds": "d_queue",
    "vllm:request_prefill_time_seconds": "d_prefill",
}
for _name, _key in REQUEST_KEYS.items():
    PROM_KEYS[_name + "_sum"] = _key + "_seconds_sum"
    PROM_KEYS[_name + "_count"] = _key + "_count"


def parse_prom(text):
    """The NIXL counters of a Prometheus text page, summed over label sets (engines)."""
    out = {v: 0.0 for v in PROM_KEYS.values()}
    seen = False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = _PROM_RE.match(line)
        if m and m.group(1) in PROM_KEYS:
            out[PROM_KEYS[m.group(1)]] += float(m.group(3))
            seen = seen or m.group(1).startswith("vllm:nixl_")
    return out if seen else None   # a page without NIXL counters is not a KV source


def prom_delta(before, after):
    """Counters of one run: after - before (None when the endpoint had no NIXL metrics)."""
    if not before or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    n = d.get("transfers", 0)
    return {
        "num_transfers": int(round(n)),
        "avg_descriptors_per_transfer": d["descriptors_sum"] / n if n else None,
        "avg_mb_per_transfer": d["bytes_sum"] / n / 2**20 if n else None,
        "avg_xfer_ms": d["xfer_seconds_sum"] / n * 1e3 if n else None,
        "throughput_mb_s": d["bytes_sum"] / 2**20 / d["xfer_seconds_sum"] if n and d["xfer_seconds_sum"] else None,
        "failed_transfers": int(round(d.get("failed_transfers", 0))),
        **request_means(d),
    }


def request_means(d):
    """{d_ttft_ms, d_queue_ms, d_prefill_ms}: mean ms per request of one run's histogram deltas
    (None where D finished no request in the run)."""
    out = {}
    for key in REQUEST_KEYS.values():
        n = d.get(key + "_count", 0)
        out[key + "_ms"] = d.get(key + "_seconds_sum", 0.0) / n * 1e3 if n else None
    return out


# ----------------------------------------------------------------------------------------
# Descriptor-per-block arithmetic
# ----------------------------------------------------------------------------------------
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8": 1, "fp8": 1}


def block_bytes(num_layers, num_kv_heads, head_dim, block_size=16, dtype_bytes=2, tp=1):
    """Bytes of one KV block over all layers (K and V) as one TP rank holds it."""
    heads = max(1, num_kv_heads // max(1, tp))
    return block_size * num_layers * 2 * heads * head_dim * dtype_bytes


def model_shape(model, tp=1):
    """The package's shape of a model (xlkv_autopatch.families.ModelShape: attention kind, Mamba layers, KV
    heads per rank) at tensor-parallel size ``tp``: for a model folder, the shape make_model.py recorded when
    it generated the model (model_shapes.SHAPE_FILE), else the package's classifier on its config.json; for
    a Hugging Face config dict, the classifier."""
    families = shim("families")
    if isinstance(model, dict):
        return families.classify(model, tp=tp, source="config")
    record = os.path.join(model, model_shapes.SHAPE_FILE)
    if os.path.isfile(record):
        with open(record) as f:
            r = json.load(f)
        return families.shape(r["attention"], kv_heads=r.get("kv_heads"), tp=tp, source=model_shapes.SHAPE_FILE)
    with open(os.path.join(model, "config.json")) as f:
        return families.classify(json.load(f), tp=tp, source="config.json")


def model_family(model, tp=1):
    """The package's family name of a model folder or config dict at tensor-parallel size ``tp``
    (xlkv_autopatch.families.FAMILIES: dense, one-kv-head, sliding-window, mla, ...)."""
    return model_shape(model, tp).family


class NotDense(ValueError):
    """The dense K/V formula does not describe this model's KV blocks."""


def model_block_bytes(model_dir, block_size=16, tp=1, kv_dtype_bytes=None):
    """The dense K/V formula for a model dir; raises NotDense for every model whose attention is not full
    attention alone (MLA, sliding-window hybrids, Mamba layers: their bytes per block id come from D's
    registration report only)."""
    shape = model_shape(model_dir, tp)
    if shape.attention != shim("families").FULL or shape.mamba:
        raise NotDense("%s model: the dense K/V formula does not apply (use D's registration report)" % shape.family)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    dt = kv_dtype_bytes or DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2)
    return block_bytes(cfg["num_hidden_layers"], cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                       head_dim, block_size, dt, tp)


def load_registration(path):
    """D's registration report (dict) or None when there is none."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def registration_bytes_per_block(rep):
    """(bytes one block id moves, note): the bytes when every KV cache group's block id moves the
    same (one group, or a hybrid with equal pages), else (None, why)."""
    if not rep:
        return None, "no registration report"
    if rep.get("error"):
        return None, "registration report: %s" % rep["error"]
    per = [b for b in rep.get("bytes_per_block_id") or [] if b]
    if not per:
        return None, "registration report without bytes per block id"
    if len(set(per)) > 1:
        return None, ("KV cache groups move different bytes per block id (%s): block ids per transfer "
                      "are not derived from the bytes" % per)
    return per[0], None


def registration_summary(rep):
    """The facts the equivalence and bench records keep from a registration report."""
    if not rep:
        return None
    keys = ("num_regions", "num_kv_cache_groups", "kv_cache_layout", "use_mla", "backend_name",
            "bytes_per_block_id", "regions_per_block_id", "region_group_ids", "block_len_per_layer", "error")
    return {k: rep.get(k) for k in keys if k in rep}


def blocks_per_transfer(avg_mb_per_transfer, bytes_per_block):
    """Avg blocks per transfer from vLLM's "Avg MB per transfer" (MiB, rounded to 3 places)."""
    if not avg_mb_per_transfer or not bytes_per_block:
        return None
    return avg_mb_per_transfer * 2**20 / bytes_per_block


def descriptors_per_block(avg_descs, avg_blocks):
    if avg_descs is None or not avg_blocks:
        return None
    return avg_descs / avg_blocks


def blocks_for_prompt(n_tokens, block_size=16):
    """Blocks a single-request probe moves: every prompt block, the partial last one too."""
    return math.ceil(n_tokens / block_size)


def descriptor_limit(attn_backend, mla=False, vllm_version=None, source_ranks=1):
    """What the shim promises per block (id) read by one decode rank: the NIXL regions one block of its
    cross-layer layout registers, as the package counts them (xlkv_autopatch.layout.cross_layer_regions):
    1 for whole rows (vLLM 0.29+), for MLA (one latent page per layer) and on FLASH_ATTN, 2 elsewhere where
    the release registers K and V apart (0.12-0.25), else 1; without ``vllm_version`` a release without
    whole-row layouts that splits K and V.
    Times ``source_ranks``, the prefill ranks a decode rank reads each block from (each holds its own
    heads' slice), except MLA (replicated: read from one)."""
    b = (attn_backend or "").upper()
    replicated = bool(mla or "MLA" in b)
    release = shim("facts").facts_for(vllm_version) if vllm_version else None
    regions = float(shim("layout").cross_layer_regions(
        backend=b, replicated=replicated, whole_rows=release.mechanism == "layout" if release else False,
        kv_split_regions=release.kv_split_regions if release else True))
    return regions if replicated else regions * max(1, int(source_ranks or 1))


def source_ranks(tp_p, tp_d, shape=None):
    """How many prefill ranks one decode rank reads each block from, as the package counts them
    (xlkv_autopatch.layout.remote_sources: 1 where decode TP >= prefill TP or the cache is replicated,
    else prefill TP / decode TP, fewer where prefill ranks share a KV head); ``shape``: the model's
    (families.ModelShape, or its dict as the results record it), for its KV heads and attention kind; 1 for
    a pairing vLLM refuses (nothing is read then)."""
    shape = shape if isinstance(shape, dict) else (dataclasses.asdict(shape) if shape is not None else {})
    n, _why = shim("layout").remote_sources(prefill_tp=int(tp_p or 1), decode_tp=int(tp_d or 1),
                                            kv_heads=shape.get("kv_heads"),
                                            replicated=shape.get("attention") in shim("families").REPLICATED)
    return n or 1


def kv_summary(kv, bytes_per_block):
    """Add blocks/descriptors-per-block to an aggregate_kv() or prom_delta() dict."""
    if not kv:
        return kv
    kv = dict(kv)
    b = blocks_per_transfer(kv.get("avg_mb_per_transfer"), bytes_per_block)
    kv["blocks_per_transfer"] = b
    kv["descriptors_per_block"] = descriptors_per_block(kv.get("avg_descriptors_per_transfer"), b)
    return kv


_BACKEND_RES = (
    re.compile(r"Using (\S+) attention backend out of potential backends"),
    re.compile(r"Using (\S+) backend\."),
)


def attention_backend(log_path):
    """Attention backend named in a vLLM server log ("FLASH_ATTN", ...), or None."""
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return None
    for rx in _BACKEND_RES:
        m = rx.findall(text)
        if m:
            return m[-1].split(".")[-1].strip("'\"")
    return None


def kv_run(log_path, offset, prom_before, prom_after, bytes_per_block, backend=None, registration=None):
    """KV numbers of one run: Prometheus deltas when D exports them (exact sums), the log
    lines after ``offset`` otherwise; both are kept for cross-checking.  ``registration`` (D's
    report): its bytes per block id replace ``bytes_per_block`` when it has them (the dense
    formula stays only where it has none, with a note)."""
    note = None
    if registration is not None:
        reg_bpb, note = registration_bytes_per_block(registration)
        bytes_per_block = reg_bpb or 0
        source = "registration" if reg_bpb else None
    else:
        source = "dense formula" if bytes_per_block else None
        if bytes_per_block:
            note = "no registration report: bytes per block from the dense K/V formula"
    kv_log = aggregate_kv(read_kv_lines(log_path, offset)) if log_path and os.path.exists(log_path) else None
    if kv_log is not None:
        kv_log["source"] = "log"
        kv_log = kv_summary(kv_log, bytes_per_block)
    kv_prom = prom_delta(prom_before, prom_after)
    if kv_prom is not None:
        kv_prom["source"] = "prom"
        kv_prom = kv_summary(kv_prom, bytes_per_block)
    if kv_prom and kv_prom.get("num_transfers"):
        chosen = dict(kv_prom)
    elif kv_log and kv_log.get("num_transfers"):
        chosen = dict(kv_log)
    else:
        chosen = {"num_transfers": 0, "source": None}
    for key in REQUEST_KEYS.values():   # from D's histograms whichever source gave the KV numbers
        chosen[key + "_ms"] = (kv_prom or {}).get(key + "_ms")
    chosen["bytes_per_block"] = bytes_per_block
    chosen["bytes_per_block_source"] = source
    if note:
        chosen["bytes_per_block_note"] = note
    if registration is not None:
        chosen["registration"] = registration_summary(registration)
        regions = [r for r in registration.get("regions_per_block_id") or []]
        if regions:
            chosen["registered_regions_per_block_id"] = regions
    chosen["log"] = kv_log
    chosen["prom"] = kv_prom
    if backend:
        chosen["attn_backend"] = backend
    return chosen
