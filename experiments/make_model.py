#!/usr/bin/env python3
"""Write a random-weight causal LM of one of a few model families (``--arch``) and a word-level tokenizer.

Architectures (``ARCHS``, the "gpu" entries of experiments/model_shapes.py, the lab's one table of
model shapes, with the family of their row; ``--layers``/``--kv-heads``/``--head-dim`` override it):

  qwen3        (default; family dense) Qwen3-0.6B: GQA, 28 layers, 8 KV heads, head_dim 128 (the model
               of every earlier run; same config and weights as before ``--arch`` existed)
  deepseek_v2  (mla) DeepSeek-V2-Lite-like: kv_lora_rank 512, qk_rope_head_dim 64,
               qk_nope_head_dim 128, v_head_dim 128, q_lora_rank None, 8 layers, every MLP dense
               (first_k_dense_replace = layers: vLLM builds no MoE layer, so no MoE kernels);
               one KV block of 16 tokens is 16 * 8 * (512 + 64) * 2 B = 144 KiB
  gemma3       (sliding-window) hybrid (Gemma3ForCausalLM, Gemma-3-4B-like widths): 12 layers,
               5:1 sliding:full via layer_types (layers 5 and 11 full), sliding_window 256,
               4 KV heads, head_dim 256: prompts of 1000 and 4097 tokens exceed the window;
               output head untied (a tied random head repeats the last prompt token)
  mqa          (one-kv-head) Qwen3-0.6B with one KV head
  gpt_oss      (sliding-window) gpt-oss-shaped (GptOssForCausalLM, gpt-oss-20b's config at smaller
               widths): attention sinks, sliding (window 128) and full layers alternating (layer_types,
               even layers sliding), 8 KV heads, head_dim 64, 8 layers, hidden 1024, a MoE MLP in every
               layer (32 experts, 4 per token, unquantized bf16); yarn rope, q/k/v/o biases, untied head


No hub access is needed: the config is spelled out here and the tokenizer is built locally.
The weights are random (seeded), so the text is meaningless, but every shape that matters
for KV-cache transfers is the real one (qwen3: 28 layers, 8 KV heads, head_dim 128, bf16 — one
KV block of 16 tokens is 16 * 28 * 2 * 8 * 128 * 2 B = 1.75 MiB).

Initialisation ("varied", the default): transformers' own init (normal, std 0.02) leaves a
28-layer random model in a fixed point: greedy decoding repeats one id whatever the prompt, so
an equivalence check over its outputs could hardly fail.  Here the input projections of every
layer (q, k, v, gate, up; MLA: q, kv_a_proj_with_mqa, kv_b_proj, q_a/q_b when q_lora_rank is set)
are drawn with std ``--proj-std`` 0.03 and the output projections
(o_proj, down_proj) with ``--out-std`` 0.01: the residual stream keeps the token and its
context apart through all 28 layers, and greedy outputs vary with the prompt (model_check.py,
28 layers, bf16, CPU: 18/27/22/27 distinct ids in 32 outputs at 5/17/100/1000 tokens, against
4/3/1/1 with transformers' init; another context with the same last 4 tokens changes every
output position; bf16 and fp32 weights give the same 32 ids: results/cpu-model-init-28layers.json).  ``--init hf`` keeps the
old weights (same seed, same bytes as before).  Shapes, dtype and so the KV block size do not
depend on the initialisation.

Beside config.json it writes ``xlkv-shape.json`` (model_shapes.SHAPE_FILE): the shape it generated in
the package's axes (attention kind, KV heads) and the table row, which the lab reads instead of
classifying config.json again.

The tokenizer maps the word ``w<k>`` to id k (k = 2 .. vocab-1), ``<unk>`` = 0, ``<eos>`` = 1,
splits on whitespace and adds no special tokens, so a prompt of n words is n tokens.

Per family, model_check.py at small size (CPU) shows the outputs depend on the prompt:
results/cpu-model-init-families.json.

usage: make_model.py OUTDIR [--arch qwen3|deepseek_v2|gemma3|gpt_oss|mqa] [--layers N] [--kv-heads N]
                     [--head-dim N] [--seed 0] [--init varied|hf] [--proj-std 0.03]
                     [--out-std 0.01] [--force] [--config-only] [--tokenizer-only]
"""

import argparse
import json
import os
import sys

UNK, EOS = "<unk>", "<eos>"

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import model_shapes  # noqa: E402  (the lab's one table of model shapes)

QWEN3_0_6B = model_shapes.QWEN3_0_6B
# The families (model_shapes.SHAPES, their "gpu" entries): transformers config class, model class
# (vLLM's architecture name), its fields, and which of them --layers, --kv-heads and --head-dim set.
ARCHS = model_shapes.GPU


def arch_fields(arch, layers=None, kv_heads=None, head_dim=None):
    """The config fields of ``arch`` with the overrides applied (None: the table's value)."""
    spec = ARCHS[arch]
    f = dict(spec["fields"])
    for opt, val in (("layers", layers), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if val is None:
            continue
        if spec[opt] is None:
            raise SystemExit("--%s does not apply to --arch %s" % (opt.replace("_", "-"), arch))
        f[spec[opt]] = val
    n = f["num_hidden_layers"]
    if spec.get("dense_replace"):      # every layer's MLP dense
        f[spec["dense_replace"]] = n
    if spec.get("layer_types"):        # every k-th layer full attention, the others sliding
        k = spec["layer_types"]
        f["layer_types"] = ["full_attention" if (i + 1) % k == 0 else "sliding_attention" for i in range(n)]
    return f


def write_shape(out, args):
    """model_shapes.SHAPE_FILE: the shape this model was generated with (the row's attention kind, the KV
    heads written), so that nothing has to guess it from config.json."""
    record = model_shapes.shape_record(args.arch, arch_fields(args.arch, args.layers, args.kv_heads, args.head_dim))
    with open(os.path.join(out, model_shapes.SHAPE_FILE), "w") as f:
        json.dump(record, f, indent=1)


def word_vocab(size):
    vocab = {UNK: 0, EOS: 1}
    vocab.update({"w%d" % i: i for i in range(2, size)})
    return vocab


def write_tokenizer(out, vocab_size, max_len):
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json (needs `tokenizers`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=word_vocab(vocab_size), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder puts a space between word pieces that lack the "##" prefix, which
    # is every word here: decode([5, 7]) == "w5 w7", and that text encodes back to [5, 7].
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "unk_token": UNK,
                   "pad_token": EOS, "model_max_length": max_len, "add_bos_token": False,
                   "clean_up_tokenization_spaces": False}, f, indent=1)
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": EOS, "unk_token": UNK, "pad_token": EOS}, f, indent=1)


# every family's projection names (transformers' modules): dense q/k/v, MLA's q (or q_a/q_b with a
# q_lora_rank), kv_a_proj_with_mqa and kv_b_proj, and the MLP's gate/up; outputs o/down.  gpt-oss's MoE: the
# router and the experts' stacked gate_up_proj (3-D, one matrix per expert) in, the experts' down_proj out
# (names no other family has, so the other families' draws, and bytes, are unchanged)
IN_PROJ = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight",
           "q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight",
           "mlp.router.weight", "mlp.experts.gate_up_proj")
OUT_PROJ = ("o_proj.weight", "down_proj.weight", "mlp.experts.down_proj")


def reinit_varied(model, seed, proj_std, out_std):
    """Redraw every layer's projections (see the module docstring); embeddings, norms unchanged.
    Returns the number of tensors redrawn."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = proj_std if name.endswith(IN_PROJ) else out_std if name.endswith(OUT_PROJ) else None
            if std is not None:
                p.copy_(torch.randn(p.shape, generator=g) * std)
                n += 1
    return n


def build_config(args):
    """The transformers config of ``args.arch`` (with the overrides)."""
    import transformers

    fields = arch_fields(args.arch, args.layers, args.kv_heads, args.head_dim)
    return getattr(transformers, ARCHS[args.arch]["config"])(
        vocab_size=args.vocab, eos_token_id=1, bos_token_id=None, pad_token_id=1, **fields)


def not_redrawn(model):
    """Names of the layers' weight matrices (2-D, and 3-D stacks of them: MoE experts; not the experts' 2-D
    stacks of biases) that the varied init would leave at transformers' init (empty for every family: a
    family whose projection names IN_PROJ/OUT_PROJ miss shows here)."""
    return [n for n, p in model.named_parameters()
            if ".layers." in n and p.dim() >= 2 and not n.endswith("bias") and not n.endswith(IN_PROJ + OUT_PROJ)]


def expert_layout_problems(model):
    """MoE expert stacks whose layout is not the one vLLM's gpt_oss.py loads from an unquantized checkpoint
    (``gate_up_proj`` [experts, hidden, 2 x intermediate], gate and up interleaved, sliced on its last axis;
    ``down_proj`` [experts, intermediate, hidden]): a transformers release that stored them transposed would
    give vLLM weights of the right size and the wrong meaning.  Empty for models without such stacks."""
    cfg, bad = model.config, []
    want = {"mlp.experts.gate_up_proj": (getattr(cfg, "num_local_experts", 0), cfg.hidden_size,
                                         2 * cfg.intermediate_size),
            "mlp.experts.down_proj": (getattr(cfg, "num_local_experts", 0), cfg.intermediate_size, cfg.hidden_size)}
    for n, p in model.named_parameters():
        for suffix, shape in want.items():
            if n.endswith(suffix) and tuple(p.shape) != shape:
                bad.append("%s %s, vLLM reads %s" % (n, tuple(p.shape), shape))
    return bad


def build_model(args):
    """The model in memory (bf16), initialised as ``args`` says."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = build_config(args)
    torch.manual_seed(args.seed)
    try:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    if args.init == "varied":
        reinit_varied(model, args.seed, args.proj_std, args.out_std)
    return model


def write_model(out, args):
    model = build_model(args)
    bad = expert_layout_problems(model)
    if bad:
        raise SystemExit("expert weights in a layout vLLM does not read: " + "; ".join(bad[:2]))
    model.save_pretrained(out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 1, "pad_token_id": 1, "do_sample": False}, f)
    return sum(p.numel() for p in model.parameters())


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="random-weight model of a family (--arch) + word tokenizer")
    ap.add_argument("outdir")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen3",
                    help="model family (default qwen3: Qwen3-0.6B-shaped, as before --arch existed)")
    ap.add_argument("--layers", type=int, default=None, help="default: the family's (qwen3 28)")
    ap.add_argument("--kv-heads", type=int, default=None, help="default: the family's (qwen3 8)")
    ap.add_argument("--head-dim", type=int, default=None, help="default: the family's (qwen3 128)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-len", type=int, default=40960)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", choices=("varied", "hf"), default="varied",
                    help="varied: outputs that depend on the prompt (default); hf: transformers' own init")
    ap.add_argument("--proj-std", type=float, default=0.03, help="varied: std of q/k/v/gate/up")
    ap.add_argument("--out-std", type=float, default=0.01, help="varied: std of o_proj/down_proj")
    ap.add_argument("--tokenizer-only", action="store_true", help="skip the weights (tests)")
    ap.add_argument("--config-only", action="store_true",
                    help="tokenizer and config.json, no weights (tests, `xlkv_autopatch status --model`)")
    ap.add_argument("--force", action="store_true", help="rewrite an existing model")
    a = ap.parse_args(argv)
    # the family's values, so that .complete records them (a qwen3 model keeps its old marker)
    spec, f = ARCHS[a.arch], ARCHS[a.arch]["fields"]
    for opt in ("layers", "kv_heads", "head_dim"):
        if getattr(a, opt) is None and spec[opt] is not None:
            setattr(a, opt, f[spec[opt]])
    if a.layers is None:
        a.layers = f["num_hidden_layers"]
    return a


def main(argv=None):
    args = parse_args(argv)

    done = os.path.join(args.outdir, ".complete")
    keys = ["arch", "init", "layers", "kv_heads", "head_dim", "vocab", "seed"]
    if args.init == "varied":
        keys += ["proj_std", "out_std"]
    partial = args.tokenizer_only or args.config_only
    if os.path.exists(done) and not args.force and not partial:
        try:
            have = json.load(open(done))
        except ValueError:
            have = {}
        have.setdefault("init", "hf")  # written before --init existed
        have.setdefault("arch", "qwen3")  # written before --arch existed
        if all(have.get(k) == getattr(args, k) for k in keys):
            if not os.path.exists(os.path.join(args.outdir, model_shapes.SHAPE_FILE)):
                write_shape(args.outdir, args)  # a model made before make_model.py recorded its shape
            print("model already there: %s (use --force to rewrite)" % args.outdir)
            return 0
        print("model in %s was made with other settings (%s): rewriting" % (args.outdir, have))
    os.makedirs(args.outdir, exist_ok=True)
    if os.path.exists(done) and not partial:
        os.remove(done)  # a half-rewritten model must not look finished
    write_tokenizer(args.outdir, args.vocab, args.max_len)
    if args.tokenizer_only:
        print("tokenizer written", args.outdir)
        return 0
    if args.config_only:
        if os.path.exists(done):
            os.remove(done)  # config only: not a finished model
        cfg = build_config(args)
        cfg.architectures = [ARCHS[args.arch]["model"]]   # what save_pretrained of the model writes
        cfg.dtype = "bfloat16"
        cfg.save_pretrained(args.outdir)
        write_shape(args.outdir, args)
        print("tokenizer and config written (%s, no weights): %s" % (args.arch, args.outdir))
        return 0
    n = write_model(args.outdir, args)
    write_shape(args.outdir, args)
    open(done, "w").write(json.dumps(vars(args)))  # marks a finished write (no half models)
    print("model written: %s (%s, %d layers, %.0fM parameters, init %s)" % (args.outdir, args.arch, args.layers,
                                                                           n / 1e6, args.init))
    return 0


if __name__ == "__main__":
    sys.exit(main())
