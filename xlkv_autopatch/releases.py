"""What differs between vLLM releases, as data: one row per supported vLLM minor release.

Everything release-dependent is derived from :data:`RELEASES` (read at call time, never copied):

* the supported range (:func:`supported_range`): the shim refuses other releases with the flag
  on, and ``python -m xlkv_autopatch status`` prints it;
* the patch groups (:func:`xlkv_autopatch.patches.all_groups`): each patch module's targets say
  which rows they are for (their ``when`` columns); consecutive rows whose patch targets agree
  form one group, named after its mechanism and first release;
* the behaviour facts the wrappers ask (:func:`xlkv_autopatch.facts.facts_for`);
* the patch catalogue in docs/mechanism.md (tools/catalogue.py, outside the package).

A new vLLM release whose NIXL code matches the last row is one more row (copy the last line
and change its release); a release that moved or changed a target needs the column that says
so.  A new column is one edit: the column in :data:`TABLE` and its :class:`Release` field (documented
there, and for a non-boolean column its values); targets select it as ``when={"<column>": ...}`` and
wrappers read it as ``facts.current().<column>``, under that one name (tests/unit/test_fact_names.py).
Standard library only: no packaging, no wrapt, no vLLM.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

V1 = "vllm.distributed.kv_transfer.kv_connector.v1"
MULTI_CONNECTOR = V1 + ".multi_connector"
VLLM_CONFIG = "vllm.config.vllm"
CONNECTOR_FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"


@dataclass(frozen=True)
class NixlHome:
    """Where a release keeps its NIXL connector code."""

    trigger: str  # the module whose import applies the release's NIXL patch set
    connector: str  # module of NixlConnector
    worker: str  # module of the worker class and of compute_nixl_compatibility_hash
    worker_class: str


#: column ``nixl`` of the table
HOMES = {
    "module": NixlHome(V1 + ".nixl_connector", V1 + ".nixl_connector", V1 + ".nixl_connector",
                       "NixlConnectorWorker"),  # one module
    "package": NixlHome(V1 + ".nixl", V1 + ".nixl.connector", V1 + ".nixl.worker", "NixlConnectorWorker"),
    "base": NixlHome(V1 + ".nixl", V1 + ".nixl.connector", V1 + ".nixl.base_worker", "NixlBaseConnectorWorker"),
}

#: column ``hash``: the parameters of compute_nixl_compatibility_hash where it is a module function
HASH_PARAMS = {
    "flag": ("vllm_config", "attn_backend_name", "cross_layers_blocks"),
    "flag+mode": ("vllm_config", "attn_backend_name", "cross_layers_blocks", "transfer_mode"),
    "mode": ("vllm_config", "attn_backend_name", "transfer_mode"),
}

#: column ``cross_layer_backends``: attention backends whose cross-layer layout upstream vLLM supports
BACKENDS = {
    "fa+fi": ("FLASH_ATTN", "FLASHINFER"),
    "fa+fi+triton": ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"),
}

#: column ``mla_cross_layer_backends``: MLA attention backends whose cross-layer blocks xlkv turns on
#: (vLLM's own NIXL guard accepts no MLA backend on 0.26-0.28, although these backends index their
#: latent cache by the block stride there, as vLLM's OffloadingConnector already uses them); each run on a GPU with P/D
#: equivalence on 0.26.0 (docs/support-matrix.md: P/D identical to stock P/D on the same model runner,
#: the negative control detected; FLASHMLA with vLLM's default kernels, it refuses batch invariance).
#: CUTLASS_MLA and FLASHINFER_MLA (SM100) are block-major too: they keep the stock layout with a
#: WARNING naming the backend until a GPU run.
MLA_BACKENDS = {
    "fa+flashmla+triton": ("FLASH_ATTN_MLA", "TRITON_MLA", "FLASHMLA"),
}

#: columns whose cells are keys of a vocabulary, and whose rows hold the key's value ("-": ())
VOCABULARIES = {"cross_layer_backends": BACKENDS, "mla_cross_layer_backends": MLA_BACKENDS}

#: values of the other non-boolean columns
MECHANISMS = ("backport", "native", "layout")
PREFERS = ("classvar", "base-property", "property")
MULTIS = ("backport", "warn")

# Columns: the fields of Release below, in order, each documented there under the one name the
# table, the patch targets' ``when``, the wrappers (facts.current().NAME) and status all use.  Cells
# are yes/no for booleans, "-" for none, and the vocabulary's keys for the non-boolean columns.
TABLE = """
release mechanism nixl    prefer        hash      has_compat_hash finished runner_v1 multi    budget_block_count fa_heads_outermost cross_layer_backends failed_recv_looks_up_engine kv_split_regions packed_groups mla_cross_layer_backends connector_turns_hma_off detokenizer_primes_prompt
0.12    backport  module  classvar      -         no              yes      no        backport no                 yes                fa+fi                yes                         yes              no            -                        yes                     no
0.13    backport  module  classvar      -         yes             yes      no        backport no                 yes                fa+fi                yes                         yes              no            -                        yes                     no
0.14    backport  module  base-property -         yes             yes      no        warn     no                 yes                fa+fi                yes                         yes              no            -                        yes                     no
0.15    backport  module  base-property -         yes             yes      no        warn     no                 yes                fa+fi                yes                         yes              no            -                        yes                     no
0.16    native    module  property      flag      yes             yes      no        warn     no                 yes                fa+fi                yes                         yes              no            -                        yes                     no
0.17    native    module  property      flag      yes             yes      no        warn     no                 yes                fa+fi                yes                         yes              no            -                        yes                     yes
0.18    native    module  property      flag      yes             yes      no        warn     yes                yes                fa+fi                yes                         yes              no            -                        yes                     yes
0.19    native    module  property      flag      yes             yes      no        warn     yes                yes                fa+fi                yes                         yes              no            -                        yes                     yes
0.20    native    package property      flag      yes             yes      no        warn     yes                yes                fa+fi+triton         yes                         yes              no            -                        yes                     yes
0.21    native    package property      flag      yes             yes      no        warn     yes                yes                fa+fi+triton         yes                         yes              no            -                        yes                     yes
0.22    native    package property      flag      yes             yes      yes       warn     yes                yes                fa+fi+triton         no                          yes              no            -                        no                      yes
0.23    native    package property      flag      yes             yes      yes       warn     yes                no                 fa+fi+triton         no                          yes              no            -                        no                      yes
0.24    native    base    property      flag      yes             no       yes       warn     yes                no                 fa+fi+triton         no                          yes              yes           -                        no                      yes
0.25    native    base    property      flag      yes             no       yes       warn     yes                no                 fa+fi+triton         no                          yes              yes           -                        no                      yes
0.26    native    base    property      flag      yes             no       yes       warn     yes                yes                fa+fi+triton         no                          no               yes           fa+flashmla+triton       no                      yes
0.27    native    base    property      flag      yes             no       yes       warn     yes                yes                fa+fi+triton         no                          no               yes           fa+flashmla+triton       no                      yes
0.28    native    base    property      flag+mode yes             no       yes       warn     yes                yes                fa+fi+triton         no                          no               yes           fa+flashmla+triton       no                      yes
0.29    layout    base    -             mode      yes             no       no        -        yes                no                 fa+fi+triton         no                          no               no            -                        no                      yes
0.30    layout    base    -             mode      yes             no       no        -        yes                no                 fa+fi+triton         no                          no               no            -                        no                      yes
0.31    layout    base    -             mode      yes             no       no        -        yes                no                 fa+fi+triton         no                          no               no            -                        no                      yes
0.32    layout    base    -             mode      yes             no       no        -        yes                no                 fa+fi+triton         no                          no               no            -                        no                      yes
0.33    layout    base    -             mode      yes             no       no        -        yes                no                 fa+fi+triton         no                          no               no            -                        no                      yes
"""


@dataclass(frozen=True)
class Release:
    """One row of :data:`TABLE`: a vLLM minor release and its facts, one field per column."""

    release: str
    #: how every block becomes one region (MECHANISMS): backport (the shim supplies vLLM's later
    #: cross-layer blocks), native (vLLM's own opt-in, turned on), layout (vLLM's KV-cache layouts,
    #: ``get_required_kvcache_layout``, chosen once per engine; no cross-layer-block API: 0.29+)
    mechanism: str
    #: where the NIXL code lives: a key of HOMES (the row's :attr:`home`)
    nixl: str
    #: NixlConnector.prefer_cross_layer_blocks: classvar (the base class's ClassVar[bool]),
    #: base-property (the base class's property), property (NIXL's own), None (no such API)
    prefer: Optional[str]
    #: compute_nixl_compatibility_hash's parameters, a key of HASH_PARAMS (the row's :attr:`hash_params`);
    #: None where there is no such module function (0.12: no hash; 0.13-0.15: computed inside the worker's
    #: __init__)
    hash: Optional[str]
    #: the worker's _nixl_handshake compares a compatibility hash (0.13+; 0.12 compares nothing)
    has_compat_hash: bool
    #: the worker has the get_finished the shim wraps (failed receives, see failed_recv_looks_up_engine)
    finished: bool
    #: Model Runner V2 is the default there and ignores cross-layer blocks: force V1
    runner_v1: bool
    #: MultiConnector: backport (no cross-layer support upstream), warn (the AND of its children's
    #: preferences), None (0.29+: vLLM asks each child for its layout)
    multi: Optional[str]
    #: the worker registers ``kv_cache_config.num_blocks`` (times the kernel ratio) and asserts the
    #: tensors hold exactly that (0.18+)
    budget_block_count: bool
    #: a FlashAttention cross-layer block keeps heads outermost, so vLLM's heterogeneous-TP slicing stays
    #: correct (0.12-0.22 and 0.26-0.28; 0.23-0.25 and the 0.29+ layouts are blocks-first)
    fa_heads_outermost: bool
    #: backends upstream's cross-layer guard accepts (cell: a key of BACKENDS; the row holds its tuple)
    cross_layer_backends: Tuple[str, ...]
    #: the worker's ``get_finished`` post-processes a failed receive like a finished one and looks its
    #: remote engine up, which a refused handshake never recorded (0.12-0.21: a KeyError that ends the
    #: worker; 0.22+ skip failed receives)
    failed_recv_looks_up_engine: bool
    #: a FlashAttention-style layer's K and V are two NIXL regions in the stock layout (0.12-0.25; one
    #: region per layer from 0.26: K/V in one page)
    kv_split_regions: bool
    #: vLLM's packed multi-group KV allocation exists (``kv_cache_utils._use_packed_kv_cache_config``,
    #: turned on by enable_cross_layers_blocks for several KV cache groups; NIXL registers it as one region
    #: through the worker's _register_packed_kv_cache): sliding-window hybrids get it (0.24-0.28)
    packed_groups: bool
    #: MLA backends whose cross-layer blocks xlkv turns on under the flag (cell: a key of MLA_BACKENDS or
    #: "-"; the row holds its tuple, () for none: MLA keeps the stock layout before 0.26 and has vLLM's own
    #: BLNHC from 0.29)
    mla_cross_layer_backends: Tuple[str, ...]
    #: any KV connector turns vLLM's hybrid KV cache manager off unless the user keeps it (config/vllm.py:
    #: "turn HMA off for connector"), so a sliding-window hybrid is planned as one KV cache group
    #: (0.12-0.21); from 0.22 only connectors without SupportsHMA do, and NIXL has it
    connector_turns_hma_off: bool
    #: FastIncrementalDetokenizer primes its tokenizer's DecodeStream with the whole prompt, decoded when the
    #: first token reaches the API server (0.17+; read from each release's wheel): the XLKV_DETOK_TAIL switch
    #: primes it with the prompt's tail (patches/incremental_detokenizer.py)
    detokenizer_primes_prompt: bool

    def __post_init__(self):
        self.check_columns()
        minor(self.release)

    def check_columns(self):
        """ValueError unless every non-boolean column holds one of its values."""
        allowed = {"mechanism": MECHANISMS, "nixl": tuple(HOMES), "prefer": PREFERS + (None,),
                   "hash": tuple(HASH_PARAMS) + (None,), "multi": MULTIS + (None,),
                   "cross_layer_backends": tuple(BACKENDS.values()),
                   "mla_cross_layer_backends": tuple(MLA_BACKENDS.values()) + ((),)}
        for name, values in allowed.items():
            if getattr(self, name) not in values:
                raise ValueError("release %s: %s=%r is not one of %s"
                                 % (self.release, name, getattr(self, name), values))

    @property
    def home(self):
        return HOMES[self.nixl]

    @property
    def hash_params(self):
        """compute_nixl_compatibility_hash's parameters (HASH_PARAMS), None where it is no module function."""
        return HASH_PARAMS.get(self.hash)


def parse_table(table):
    """Release rows from a text table like :data:`TABLE` (header: Release's fields; ValueError on an
    unknown column or value)."""
    lines = [line.split() for line in table.strip().splitlines()]
    header, rows = lines[0], lines[1:]
    if tuple(header) != tuple(Release.__dataclass_fields__):
        raise ValueError("release table columns %s are not Release's fields" % (header,))
    out = []
    for cells in rows:
        if len(cells) != len(header):
            raise ValueError("release table row %s: %d cells for %d columns" % (cells, len(cells), len(header)))
        values = {}
        for name, cell in zip(header, cells):
            kind = Release.__dataclass_fields__[name].type
            if kind is bool or kind == "bool":
                if cell not in ("yes", "no"):
                    raise ValueError("release table row %s: %s=%r is not yes/no" % (cells[0], name, cell))
                values[name] = cell == "yes"
            elif name in VOCABULARIES:  # a key of the column's vocabulary: the row holds its value
                vocabulary = VOCABULARIES[name]
                if cell != "-" and cell not in vocabulary:
                    raise ValueError("release table row %s: %s=%r is not one of %s"
                                     % (cells[0], name, cell, tuple(vocabulary) + ("-",)))
                values[name] = vocabulary.get(cell, ())
            else:
                values[name] = None if cell == "-" else cell
        out.append(Release(**values))
    return tuple(out)


def minor(release):
    """(major, minor) of "0.12" (a table row's release)."""
    major, _, rest = release.partition(".")
    if not (major.isdigit() and rest.isdigit()):
        raise ValueError("%r is not a MAJOR.MINOR release" % (release,))
    return int(major), int(rest)


def _next(release):
    major, m = minor(release)
    return "%d.%d" % (major, m + 1)


def span(first, last):
    """The PEP 440 range of rows ``first`` to ``last`` (Release rows or release strings)."""
    first = getattr(first, "release", first)
    last = getattr(last, "release", last)
    return ">=%s,<%s" % (first, _next(last))


def supported_range():
    """The vLLM releases the shim supports: the table's first row to its last."""
    return span(RELEASES[0], RELEASES[-1])


def runs(key):
    """[[rows]]: maximal runs of consecutive rows with the same ``key(row)``, rows whose key is
    None (or False) left out."""
    out, prev = [], None
    for row in RELEASES:
        k = key(row)
        if k is None or k is False:
            prev = None
            continue
        if out and prev is not None and k == prev:
            out[-1].append(row)
        else:
            out.append([row])
        prev = k
    return out


def row_for(release):
    """The row of a (major, minor, ...) tuple: the last row not after it, or the first row for
    a release older than the table (its facts are the oldest known; whether it is supported is
    :func:`supported_range`'s business)."""
    key = tuple(release[:2])
    rows = RELEASES
    found = rows[0]
    for row in rows:
        if minor(row.release) <= key:
            found = row
    return found


#: the supported vLLM minor releases, oldest first, consecutive
RELEASES = parse_table(TABLE)
