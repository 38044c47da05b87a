#!/usr/bin/env python3
"""Trains offgraph's demo model: a small Qwen3-family language model on the
King James Version of the Bible (public domain), as Debian's bible-kjv
package prints it.

    bible "Genesis 1:1-Revelation 22:21" > kjv-raw.txt      # Debian: bible-kjv
    python3 scripts/train_demo_model.py kjv-raw.txt OUT_DIR [--max-seconds 420]

OUT_DIR receives the Hugging Face layout (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json), a model card
(README.md), the loss curve (loss.png), the loss log (loss.csv) and the golden
greedy continuations (golden.json) that offgraph's tests compare against.

The architecture exercises what offgraph's runtime must handle: grouped-query
attention (8 query heads over 2 kv heads), q/k RMS norm, tied embeddings, and
`layer_types` that mix full attention with sliding-window layers (window 64),
so that ring storage is used in every generation longer than 64 tokens.
Needs torch, transformers (5.x), tokenizers, safetensors, matplotlib; one GPU.
"""
import argparse
import json
import math
import os
import re
import time

import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
EOS = "<|endoftext|>"
VOCAB = 4096
SEQ = 256
BATCH = 64
STEPS = 4000
PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "Blessed are the",
           "The LORD is my shepherd;", "And it came to pass"]
GOLDEN_TOKENS = 48


def clean(raw):
    """bible's output: a "Book N" heading per chapter, then verses that start
    with their number and wrap at 80 columns. Keeps one paragraph per chapter
    of plain prose, verse numbers dropped, chapters separated by EOS."""
    chapters, cur = [], []
    for line in raw.splitlines():
        if re.match(r"^\S.* \d+$", line) and not line.startswith(" "):
            if cur:
                chapters.append(" ".join(cur))
            cur = []
            continue
        line = line.strip()
        if not line:
            continue
        line = re.sub(r"^\d+ ", "", line)
        cur.append(line)
    if cur:
        chapters.append(" ".join(cur))
    return [re.sub(r"\s+", " ", c).strip() for c in chapters if c.strip()]


def train_tokenizer(chapters):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(chapters, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, bos_token=None)


def greedy(model, ids, n):
    """Greedy continuation by full forward passes (no cache), float32; also
    the smallest gap between the two best logits along the way."""
    ids = list(ids)
    out, gaps = [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids], device="cuda"), use_cache=False).logits[0, -1].float()
            top = logits.topk(2)
            gaps.append((top.values[0] - top.values[1]).item())
            nxt = int(top.indices[0])
            out.append(nxt)
            ids.append(nxt)
    return out, gaps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--max-seconds", type=float, default=420)
    args = ap.parse_args()
    torch.manual_seed(0)
    os.makedirs(args.out, exist_ok=True)
    chapters = clean(open(args.raw, encoding="utf-8").read())
    tok = train_tokenizer(chapters)
    eos = tok.convert_tokens_to_ids(EOS)
    ids = []
    for c in chapters:
        ids.extend(tok(c, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    data = torch.tensor(ids, dtype=torch.long)
    n_val = len(data) // 50
    train, val = data[:-n_val].cuda(), data[-n_val:].cuda()
    print(f"{len(chapters)} chapters, {len(data)} tokens, vocab {len(tok)}", flush=True)

    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=True, sliding_window=64,
        max_window_layers=0,
        layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=eos, pad_token_id=eos)
    model = Qwen3ForCausalLM(config).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 200

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (STEPS - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    g = torch.Generator(device="cuda").manual_seed(0)
    log, t0, step = [], time.time(), 0
    model.train()
    while step < STEPS and time.time() - t0 < args.max_seconds:
        starts = torch.randint(0, len(train) - SEQ - 1, (BATCH,), device="cuda", generator=g)
        x = torch.stack([train[s:s + SEQ] for s in starts.tolist()])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % 50 == 0 or step == 1:
            log.append((step, loss.item()))
            print(f"step {step} loss {loss.item():.3f} {time.time() - t0:.0f}s", flush=True)
    train_seconds = time.time() - t0

    model.eval()
    with torch.no_grad():
        # bf16 weights are what ships: evaluate and make the goldens with them
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        vl = []
        for i in range(0, len(val) - SEQ - 1, SEQ * 8):
            x = val[i:i + SEQ][None]
            vl.append(model(input_ids=x, labels=x).loss.item())
        val_loss = sum(vl) / len(vl)
    print(f"val loss {val_loss:.3f} after {step} steps, {train_seconds:.0f}s", flush=True)

    model.to(torch.bfloat16).save_pretrained(args.out)
    tok.save_pretrained(args.out)
    model.float()
    golden = []
    for p in PROMPTS:
        pid = tok(p, add_special_tokens=False)["input_ids"]
        cont, gaps = greedy(model, pid, GOLDEN_TOKENS)
        golden.append({"prompt": p, "prompt_ids": pid, "continuation_ids": cont,
                       "continuation": tok.decode(cont), "min_top2_gap": min(gaps)})
        print(json.dumps(golden[-1]), flush=True)
    with open(os.path.join(args.out, "golden.json"), "w") as f:
        json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
                   "method": "greedy, full forward per token, weights as shipped (bf16)", "cases": golden},
                  f, indent=1, ensure_ascii=False)
    with open(os.path.join(args.out, "loss.csv"), "w") as f:
        f.write("step,loss\n" + "".join(f"{s},{l:.4f}\n" for s, l in log))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([s for s, _ in log], [l for _, l in log])
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats/token)")
    ax.set_title("offgraph demo model on the KJV text")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "loss.png"))
    epochs = step * BATCH * SEQ / len(train)
    memorised = ""
    if val_loss > 2 * log[-1][1]:
        memorised = ("\nThe held-out loss is far above the training loss: {:.1f} M parameters trained for about "
                     "{:.0f} passes over {:.1f} M tokens have largely memorised the text. That is what makes the "
                     "output read well at this size; it recites and recombines passages rather than "
                     "generalising.\n").format(n_params / 1e6, epochs, len(train) / 1e6)
    card = f"""# kjv-tiny: offgraph's demo model

A small Qwen3-family causal language model trained from scratch by `scripts/train_demo_model.py`
so that offgraph can show real text on a machine without a GPU, right after the build.

| | |
|---|---|
| data | the King James Version of the Bible as Debian's `bible-kjv` package prints it (`bible "Genesis 1:1-Revelation 22:21"`), verse numbers removed, one paragraph per chapter ({len(chapters)} chapters, {len(data):,} tokens) |
| licence of the data | the KJV text (1611) is in the public domain; the package's copyright file says so |
| tokenizer | byte-level BPE, {len(tok)} tokens, trained with `tokenizers` on the same text (Qwen-style split regex, NFC) |
| architecture | Qwen3: 6 layers, hidden 256, intermediate 768, 8 query heads over 2 kv heads, head dim 32, q/k norm, tied embeddings; `layer_types` full/sliding/full/sliding/sliding/full with a window of 64 tokens |
| parameters | {n_params:,} (bf16 weights, {n_params * 2 / 1e6:.1f} MB) |
| training | {step} steps of {BATCH} x {SEQ} tokens, AdamW (lr 2e-3, warm-up 200, cosine to 10 %, weight decay 0.1), bf16 autocast, {train_seconds:.0f} s on one GPU |
| final loss | training {log[-1][1]:.3f}, held-out (last 2 % of the text) {val_loss:.3f} nats/token |
| made with | torch {torch.__version__}, transformers {transformers.__version__} |

![loss curve](loss.png)

`golden.json` holds greedy continuations of a few prompts computed by transformers in float32 with
the shipped bf16 weights; offgraph's tests must reproduce them token for token.

It is a toy: it continues text in the style of the KJV and knows nothing else.
{memorised}"""
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(card)


if __name__ == "__main__":
    main()
