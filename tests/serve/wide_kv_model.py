"""A Hugging Face Qwen3 checkpoint with kjv-tiny's tokenizer and sizes but
wide KV rows (8 key/value heads of 128 dimensions: 8 KiB a token and layer
in f32, against kjv-tiny's 512 bytes), every layer full attention (a fork of
a session past a sliding window's reach is refused, so kjv-tiny's rings would
keep the prefix cache from ever forking at a prompt's end) and random bf16
weights. A request then starts from a fork of a cached prompt and outgrows
several of the CUDA KV allocator's 2 MiB chunks: every request allocates
device memory as it grows (tests/cli_serve_faults.sh on a GPU). Standard
library only.

  python3 wide_kv_model.py MODELS/kjv-tiny OUT_DIR
"""
import json
import os
import random
import shutil
import struct
import sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
cfg = json.load(open(os.path.join(src, "config.json")))
cfg.update(num_attention_heads=8, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
           use_sliding_window=False, sliding_window=None,
           layer_types=["full_attention"] * cfg["num_hidden_layers"])
H, D, I, V = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]
Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

rng = random.Random(0)
# a bf16's high byte is its sign and the top 7 bits of its exponent: keeping
# the sign and fixing those bits to 0x3C gives magnitudes of 2^-7 to 2^-6
HIGH = bytes((b & 0x80) | 0x3C for b in range(256))
ONE = struct.pack("<H", 0x3F80)  # bf16 1.0, for the norms' weights

shapes = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H]}
for i in range(cfg["num_hidden_layers"]):
    p = "model.layers.%d." % i
    shapes.update({
        p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
        p + "self_attn.q_proj.weight": [Hq * D, H], p + "self_attn.k_proj.weight": [Hkv * D, H],
        p + "self_attn.v_proj.weight": [Hkv * D, H], p + "self_attn.o_proj.weight": [H, Hq * D],
        p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
        p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H], p + "mlp.down_proj.weight": [H, I],
    })

header, blobs, offset = {}, [], 0
for name, shape in sorted(shapes.items()):
    n = 1
    for d in shape:
        n *= d
    if len(shape) == 1:
        data = ONE * n
    else:
        raw = bytearray(rng.randbytes(2 * n))
        raw[1::2] = bytes(raw[1::2]).translate(HIGH)
        data = bytes(raw)
    header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
head = json.dumps(header).encode()
head += b" " * (-len(head) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(head)))
    f.write(head)
    for b in blobs:
        f.write(b)
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    if os.path.exists(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), os.path.join(out, name))
print("wide-KV checkpoint: %s (%.1f MB)" % (out, offset / 1e6))
