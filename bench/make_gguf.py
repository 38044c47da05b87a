#!/usr/bin/env python3
"""Writes a Qwen3 safetensors checkpoint (config.json + model.safetensors or a
sharded index, bf16 weights) as a GGUF file that llama.cpp loads, so that its
llama-bench can time the same model as offgraph (bench/cpu.sh, bench/gpu/run.sh).

    python3 bench/make_gguf.py HF_DIR OUT.gguf [--arch llama]

--arch llama writes the checkpoint as a llama-architecture file instead, for
llama.cpp builds that predate qwen3: the same matrices, q and k rows put in
llama.cpp's rotary layout as its converter does (per head, the two rotary
halves interleaved), and no q / k norms (the one difference of the two
architectures; a few thousand multiplies a token, nothing to a benchmark).

Needs numpy and the `gguf` Python package (the gguf-py folder of a llama.cpp
source tree on PYTHONPATH, or `pip install gguf`). No tokenizer is needed: the
benchmark checkpoints have none, so the file says "no_vocab" with the config's
vocab_size, which llama.cpp accepts (it makes dummy tokens; llama-bench feeds
random token ids). Matrices stay bf16 byte for byte; 1-D norm weights are
written as f32, as llama.cpp's own converter does.
"""
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_gguf.py: the gguf package is missing: put the gguf-py folder of a llama.cpp "
             "source tree on PYTHONPATH (or pip install gguf)")


def safetensors_tensors(hf_dir):
    """Yields (name, dtype tag, shape, memmap of the raw bytes) for every tensor."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for fname in files:
        path = os.path.join(hf_dir, fname)
        with open(path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            yield name, info["dtype"], tuple(info["shape"]), data[a:b]


def bf16_to_f32(raw):
    bits = raw.view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def main():
    args = sys.argv[1:]
    as_llama = "--arch" in args and args[args.index("--arch") + 1:args.index("--arch") + 2] == ["llama"]
    if as_llama:
        i = args.index("--arch")
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    hf_dir, out = args
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    if cfg.get("model_type") != "qwen3":
        sys.exit(f"make_gguf.py: model_type {cfg.get('model_type')!r}: only qwen3 is written")
    arch = gguf.MODEL_ARCH.LLAMA if as_llama else getattr(gguf.MODEL_ARCH, "QWEN3", None)
    if arch is None:
        sys.exit(f"make_gguf.py: the gguf package at {os.path.dirname(gguf.__file__)} predates Qwen3 "
                 "(no MODEL_ARCH.QWEN3): put the gguf-py folder of the llama.cpp tree llama-bench was built "
                 "from first on PYTHONPATH")
    n_layers = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    names = gguf.get_tensor_name_map(arch, n_layers)
    if cfg.get("use_sliding_window") and "sliding_attention" in (cfg.get("layer_types") or []):
        # llama.cpp's qwen3 graph has no sliding window: its layers attend to the whole
        # context, so the file is the same model only while the context fits the window
        # (for timing, each such layer reads more KV than the original would)
        print(f"make_gguf.py: sliding window of {cfg.get('sliding_window')} not written "
              "(llama.cpp's qwen3 attends to the whole context)", file=sys.stderr)

    w = gguf.GGUFWriter(out, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("qwen3-benchmark-checkpoint")
    w.add_context_length(cfg.get("max_position_embeddings", 40960))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(n_layers)
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg.get("num_key_value_heads", cfg["num_attention_heads"]))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 1000000.0
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_tokenizer_model("no_vocab")

    count = 0
    for name, tag, shape, raw in safetensors_tensors(hf_dir):
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        if as_llama and (".q_norm." in name or ".k_norm." in name):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            sys.exit(f"make_gguf.py: no GGUF name for tensor {name}")
        if as_llama and tag == "BF16" and (".q_proj." in name or ".k_proj." in name):
            heads = shape[0] // head_dim  # rows 2i + s of a head <- row s * D / 2 + i
            a = raw.view(np.uint16).reshape(heads, 2, head_dim // 2, shape[1]).swapaxes(1, 2).reshape(shape)
            w.add_tensor(new, np.ascontiguousarray(a), raw_dtype=gguf.GGMLQuantizationType.BF16)
        elif tag == "BF16" and len(shape) >= 2:
            w.add_tensor(new, raw.view(np.uint16).reshape(shape), raw_dtype=gguf.GGMLQuantizationType.BF16)
        elif tag == "BF16":
            w.add_tensor(new, bf16_to_f32(raw).reshape(shape))
        elif tag == "F32":
            w.add_tensor(new, raw.view(np.float32).reshape(shape))
        elif tag == "F16":
            w.add_tensor(new, raw.view(np.float16).reshape(shape))
        else:
            sys.exit(f"make_gguf.py: tensor {name}: dtype {tag} is not handled")
        count += 1

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(json.dumps({"gguf": out, "tensors": count, "bytes": os.path.getsize(out)}))


if __name__ == "__main__":
    main()
