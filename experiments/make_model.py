#!/usr/bin/env python3
"""Write a random-weight causal LM with the Qwen3-0.6B architecture and a word-level tokenizer.

No hub access is needed: the config is spelled out here and the tokenizer is built locally.
The weights are random (seeded), so the text is meaningless, but every shape that matters
for KV-cache transfers is the real one: 28 layers, 8 KV heads, head_dim 128, bf16 — one KV
block of 16 tokens is 16 * 28 * 2 * 8 * 128 * 2 B = 1.75 MiB.

Initialisation ("varied", the default): transformers' own init (normal, std 0.02) leaves a
28-layer random model in a fixed point: greedy decoding repeats one id whatever the prompt, so
an equivalence check over its outputs could hardly fail.  Here the input projections of every
layer (q, k, v, gate, up) are drawn with std ``--proj-std`` 0.03 and the output projections
(o_proj, down_proj) with ``--out-std`` 0.01: the residual stream keeps the token and its
context apart through all 28 layers, and greedy outputs vary with the prompt (model_check.py,
28 layers, bf16, CPU: 18/27/22/27 distinct ids in 32 outputs at 5/17/100/1000 tokens, against
4/3/1/1 with transformers' init; another context with the same last 4 tokens changes every
output position; bf16 and fp32 weights give the same 32 ids: results/cpu-model-init-28layers.json).  ``--init hf`` keeps the
old weights (same seed, same bytes as before).  Shapes, dtype and so the KV block size do not
depend on the initialisation.

The tokenizer maps the word ``w<k>`` to id k (k = 2 .. vocab-1), ``<unk>`` = 0, ``<eos>`` = 1,
splits on whitespace and adds no special tokens, so a prompt of n words is n tokens.

usage: make_model.py OUTDIR [--layers 28] [--kv-heads 8] [--head-dim 128] [--seed 0]
                     [--init varied|hf] [--proj-std 0.03] [--out-std 0.01] [--force]
"""

import argparse
import json
import os
import sys

UNK, EOS = "<unk>", "<eos>"

# Qwen3-0.6B (config.json of Qwen/Qwen3-0.6B), with a smaller vocabulary that matches the
# word-level tokenizer below.
QWEN3_0_6B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=True,
    attention_bias=False,
)


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


IN_PROJ = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")
OUT_PROJ = ("o_proj.weight", "down_proj.weight")


def reinit_varied(model, seed, proj_std, out_std):
    """Redraw every layer's projections (see the module docstring); embeddings, norms unchanged."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = proj_std if name.endswith(IN_PROJ) else out_std if name.endswith(OUT_PROJ) else None
            if std is not None:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def build_model(args):
    """The model in memory (bf16), initialised as ``args`` says."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    arch = dict(QWEN3_0_6B, num_hidden_layers=args.layers, num_key_value_heads=args.kv_heads,
                head_dim=args.head_dim)
    cfg = Qwen3Config(vocab_size=args.vocab, eos_token_id=1, bos_token_id=None, pad_token_id=1, **arch)
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
    model.save_pretrained(out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": 1, "pad_token_id": 1, "do_sample": False}, f)
    return sum(p.numel() for p in model.parameters())


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="random-weight Qwen3-0.6B-shaped model + word tokenizer")
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-len", type=int, default=40960)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--init", choices=("varied", "hf"), default="varied",
                    help="varied: outputs that depend on the prompt (default); hf: transformers' own init")
    ap.add_argument("--proj-std", type=float, default=0.03, help="varied: std of q/k/v/gate/up")
    ap.add_argument("--out-std", type=float, default=0.01, help="varied: std of o_proj/down_proj")
    ap.add_argument("--tokenizer-only", action="store_true", help="skip the weights (tests)")
    ap.add_argument("--force", action="store_true", help="rewrite an existing model")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)

    done = os.path.join(args.outdir, ".complete")
    keys = ["init", "layers", "kv_heads", "head_dim", "vocab", "seed"]
    if args.init == "varied":
        keys += ["proj_std", "out_std"]
    if os.path.exists(done) and not args.force and not args.tokenizer_only:
        try:
            have = json.load(open(done))
        except ValueError:
            have = {}
        have.setdefault("init", "hf")  # written before --init existed
        if all(have.get(k) == getattr(args, k) for k in keys):
            print("model already there: %s (use --force to rewrite)" % args.outdir)
            return 0
        print("model in %s was made with other settings (%s): rewriting" % (args.outdir, have))
    os.makedirs(args.outdir, exist_ok=True)
    if os.path.exists(done) and not args.tokenizer_only:
        os.remove(done)  # a half-rewritten model must not look finished
    write_tokenizer(args.outdir, args.vocab, args.max_len)
    if args.tokenizer_only:
        print("tokenizer written", args.outdir)
        return 0
    n = write_model(args.outdir, args)
    open(done, "w").write(json.dumps(vars(args)))  # marks a finished write (no half models)
    print("model written: %s (%d layers, %.0fM parameters, init %s)" % (args.outdir, args.layers, n / 1e6, args.init))
    return 0


if __name__ == "__main__":
    sys.exit(main())
