#!/usr/bin/env python3
"""Peers timed side by side with offgraph (bench/gpu/run.sh):

  peer.py make-qwen3 DIR [SHAPE]    Qwen3-shaped checkpoint, random bf16 weights; SHAPE is
                                    0.6b (default: hidden 1024, 28 layers, tied), 8b (hidden
                                    4096, intermediate 12288, 36 layers, 32/8 heads, untied)
                                    or 32b (hidden 5120, intermediate 25600, 64 layers, 64/8
                                    heads, untied)
  peer.py qwen3-tokenizer DIR TEMPLATE_DIR
                                    gives DIR a tokenizer of the model's whole vocabulary
                                    (for offgraph serve): TEMPLATE_DIR's byte-level BPE
                                    (a small test tokenizer), its vocabulary padded with
                                    unique filler pieces up to the config's vocab_size
  peer.py sdpa                      torch SDPA (enable_gqa=True) decode attention,
                                    Hq=32, Hkv=8, D=128, bf16, histories 4k/32k/128k
  peer.py generate DIR CTX GEN      transformers generate, static cache, greedy,
                                    decode tokens/s at context CTX
  peer.py batch DIR CTX GEN B...    transformers batched generate, static cache, greedy:
                                    B random prompts of CTX tokens, aggregate decode
                                    tokens/s = B x (GEN - 1) / (time of GEN new tokens -
                                    time of 1); PEER_COMPILE=off disables the automatic
                                    torch.compile of the forward (default: transformers'
                                    own choice, which compiles with a static cache)
  peer.py floor DIR CTX COPY_GBPS [WEIGHTS]
                                    bytes floor of one decode step: weights read
                                    once (matrices as bf16, q8 or q4) plus the KV
                                    of CTX tokens, at the copy rate

Each prints one JSON line. Timing: CUDA events, warm-up first, median, inputs
rotated so that one round exceeds the L2.
"""
import json
import sys
import time

import torch


QWEN3_SHAPES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               tie_word_embeddings=False),
    "32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                tie_word_embeddings=False),
}


def qwen3_config(shape="0.6b"):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=151936, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, **QWEN3_SHAPES[shape])


def make_qwen3(out, shape="0.6b"):
    """Random weights drawn in bf16 on the device, layer by layer, so that the
    8b and 32b shapes need no f32 copy of the whole model."""
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3_config(shape))
    model = model.to_empty(device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.save_pretrained(out)
    print(json.dumps({"made": out, "shape": shape, "params": sum(p.numel() for p in model.parameters())}))


def qwen3_tokenizer(out, template_dir):
    """Pads a small byte-level BPE to the model's vocabulary: random weights
    sample any of the vocab_size ids, and a server must turn each into text."""
    import os
    import shutil
    vocab_size = json.load(open(os.path.join(out, "config.json")))["vocab_size"]
    tok = json.load(open(os.path.join(template_dir, "tokenizer.json")))
    vocab = tok["model"]["vocab"]
    taken = set(vocab) | {a["content"] for a in tok["added_tokens"]}
    used = set(vocab.values()) | {a["id"] for a in tok["added_tokens"]}
    # the byte-level alphabet: the characters single bytes map to
    alphabet = [chr(b) for b in range(33, 127)] + [chr(b) for b in range(161, 173)] + [chr(b) for b in range(174, 256)]
    alphabet += [chr(256 + i) for i in range(256 - len(alphabet))]
    def fillers():
        for a in alphabet:
            for b in alphabet:
                yield a + b
        for a in alphabet:
            for b in alphabet:
                for c in alphabet:
                    yield a + b + c
    gen = fillers()
    for i in range(vocab_size):
        if i in used:
            continue
        piece = next(gen)
        while piece in taken:
            piece = next(gen)
        vocab[piece] = i
        taken.add(piece)
    json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
    shutil.copy(os.path.join(template_dir, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))
    print(json.dumps({"tokenizer": out, "vocab": len(vocab) + len(tok["added_tokens"])}))


def median_ms(fn, reps=200, warm=10):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def sdpa():
    import torch.nn.functional as F
    hq, hkv, d = 32, 8, 128
    for L in (4096, 32768, 131072):
        kv_bytes = 2 * L * hkv * d * 2
        n = max(2, int(256e6 / kv_bytes) + 1)
        q = torch.randn(1, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        ks = [torch.randn(1, hkv, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
        vs = [torch.randn(1, hkv, L, d, device="cuda", dtype=torch.bfloat16) for _ in range(n)]
        i = [0]

        def step():
            j = i[0] % n
            i[0] += 1
            F.scaled_dot_product_attention(q, ks[j], vs[j], enable_gqa=True)

        ms = median_ms(step)
        print(json.dumps({"bench": "decode_attention", "impl": "torch_sdpa_gqa", "L": L, "us": ms * 1e3,
                          "kv_GBps": kv_bytes / (ms * 1e-3) / 1e9}))
        del ks, vs


def generate(path, ctx, gen):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 151936, (1, ctx), device="cuda")
    # a static cache where the model takes one (hybrid models keep their own)
    cache = {"cache_implementation": "static"}

    def run(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **cache)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    with torch.no_grad():
        try:
            run(2)
        except Exception as e:  # noqa: BLE001 - any refusal of the static cache
            print(json.dumps({"note": "static cache refused, the model's default cache used", "why": str(e)[:200]}))
            cache = {}
            run(2)
        run(gen)  # warm-up
        t1 = min(run(1) for _ in range(3))
        tn = min(run(gen) for _ in range(3))
    print(json.dumps({"bench": "e2e_decode", "impl": "transformers_" + ("static_cache" if cache else "default_cache"),
                      "context": ctx, "gen": gen, "decode_tokens_per_s": (gen - 1) / (tn - t1)}))


def batch(path, ctx, gen, sizes):
    import os
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    compiled = os.environ.get("PEER_COMPILE", "auto") != "off"
    if not compiled:
        model.generation_config.disable_compile = True
    for b in sizes:
        ids = torch.randint(0, 151936, (b, ctx), device="cuda")
        mask = torch.ones_like(ids)

        def run(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           cache_implementation="static", pad_token_id=0)
            torch.cuda.synchronize()
            return time.perf_counter() - t

        with torch.no_grad():
            run(gen), run(1)  # warm-up (and compilation, where it happens)
            t1 = min(run(1) for _ in range(2))
            tn = min(run(gen) for _ in range(2))
        agg = b * (gen - 1) / (tn - t1)
        print(json.dumps({"bench": "batch_decode", "impl": "transformers_static_cache", "compiled": compiled,
                          "sessions": b, "context": ctx, "gen": gen, "decode_tokens_per_s": agg,
                          "decode_tokens_per_s_per_session": agg / b}))
        del ids, mask
        torch.cuda.empty_cache()


# bytes per weight of a matrix in offgraph's formats: q8 and q4 keep an f16
# scale per group of 32 beside the quants (docs/program-format.md)
FORMAT_BYTES = {"bf16": 2.0, "q8": 1.0 + 2.0 / 32, "q4": 0.5 + 2.0 / 32}


def floor(path, ctx, copy_gbps, weights="bf16"):
    """Bytes a decode step must read: every weight but the embedding table
    (one row of it is read; a tied table is read whole as the head), matrices
    in the given format (bf16, q8, q4), and the bf16 KV of ctx positions."""
    import glob
    import os
    from safetensors import safe_open
    cfg = json.load(open(os.path.join(path, "config.json")))
    wbytes = 0
    for shard in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(shard, "pt") as f:
            for k in f.keys():
                if k.endswith("embed_tokens.weight") and not cfg.get("tie_word_embeddings"):
                    continue
                t = f.get_slice(k)
                n = 1
                for s in t.get_shape():
                    n *= s
                wbytes += n * (FORMAT_BYTES[weights] if len(t.get_shape()) == 2 else 2)
    kv = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg.get("head_dim", 128) * 2 * ctx
    step = wbytes + kv
    # the copy rate counts bytes moved (read + written); a decode step moves step bytes
    print(json.dumps({"bench": "e2e_decode", "impl": "bytes_floor", "context": ctx, "bytes_per_token": int(step),
                      "decode_tokens_per_s": copy_gbps * 1e9 / step}))


def floor_ogp(path, ctx, copy_gbps):
    """floor() from a program file's own byte counts (for formats that mix
    types per matrix, as the k-quant mixes do): every weight but an untied
    embedding table (one row of it is read), and the bf16 KV of ctx positions."""
    import struct
    with open(path, "rb") as fh:
        head = fh.read(40)
        m = json.loads(fh.read(struct.unpack("<Q", head[16:24])[0]))
    model = m["model"]
    wbytes = sum(t["nbytes"] for t in m["tensors"] if t.get("binding") == "weight" and
                 not (t["name"] == "model.embed_tokens.weight" and not model.get("tie_word_embeddings")))
    kv = 2 * model["num_hidden_layers"] * model["num_key_value_heads"] * model["head_dim"] * 2 * ctx
    step = wbytes + kv
    print(json.dumps({"bench": "e2e_decode", "impl": "bytes_floor", "context": ctx, "bytes_per_token": int(step),
                      "decode_tokens_per_s": copy_gbps * 1e9 / step}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make-qwen3":
        make_qwen3(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "0.6b")
    elif cmd == "qwen3-tokenizer":
        qwen3_tokenizer(sys.argv[2], sys.argv[3])
    elif cmd == "floor-ogp":
        floor_ogp(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif cmd == "sdpa":
        sdpa()
    elif cmd == "generate":
        generate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "batch":
        batch(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), [int(b) for b in sys.argv[5:]])
    elif cmd == "floor":
        floor(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else "bf16")
    else:
        sys.exit(__doc__)
