"""Writes a GGUF file with llama.cpp's own writer and quantizers (PyPI
`gguf`), and gguf's dequantization of every tensor as stored: the oracle
for Tessera's model-file loading.

Usage:
    python3 write_gguf.py OUT_DIR SEED NAME:TYPE:ROWS:COLS ...

Writes OUT_DIR/model.gguf (architecture `llama`, with the llama metadata
keys `--model` tuning reads and a small tokenizer array) and, per tensor,
OUT_DIR/<NAME>.deq: little-endian f32 [ROWS, COLS], gguf's `dequantize` of
the bytes in the file. TYPE is a GGMLQuantizationType name. Types gguf can
quantize (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q5_0, ...) are quantized from
random weights of mixed magnitudes; Q4_K and Q6_K, which gguf only
dequantizes, are random super-blocks with every field set (f16 scales of
realistic size, random 6-bit scales and mins, random codes).
Metadata values come from environment variables when set (GGUF_BLOCKS,
GGUF_EMBD, GGUF_FF, GGUF_HEADS, GGUF_KV_HEADS).
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

out, seed, specs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rng = np.random.default_rng(seed)


def random_k_blocks(qtype, n_blocks):
    _, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    scale = rng.uniform(1e-3, 2e-2, size=n_blocks).astype(np.float16)
    if qtype == GGMLQuantizationType.Q4_K:
        raw[:, 0:2] = scale.view(np.uint8).reshape(n_blocks, 2)
        dmin = rng.uniform(1e-3, 2e-2, size=n_blocks).astype(np.float16)
        raw[:, 2:4] = dmin.view(np.uint8).reshape(n_blocks, 2)
    elif qtype == GGMLQuantizationType.Q6_K:
        raw[:, 208:210] = scale.view(np.uint8).reshape(n_blocks, 2)
    else:
        raise SystemExit(f"no block generator for {qtype.name}")
    return raw


def env(name, default):
    return int(os.environ.get(name, default))


w = GGUFWriter(f"{out}/model.gguf", "llama")
w.add_block_count(env("GGUF_BLOCKS", 1))
w.add_context_length(256)
w.add_embedding_length(env("GGUF_EMBD", 64))
w.add_feed_forward_length(env("GGUF_FF", 96))
w.add_head_count(env("GGUF_HEADS", 4))
w.add_head_count_kv(env("GGUF_KV_HEADS", 2))
w.add_layer_norm_rms_eps(1e-6)
w.add_tokenizer_model("llama")
w.add_token_list([f"tok{i}" for i in range(10)])
w.add_token_scores([float(i) for i in range(10)])

for spec in specs:
    name, tname, rows, cols = spec.split(":")
    rows, cols = int(rows), int(cols)
    qtype = GGMLQuantizationType[tname]
    block, _ = GGML_QUANT_SIZES[qtype]
    if qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K):
        blocks = random_k_blocks(qtype, rows * cols // block)
        data = blocks.reshape(rows, -1)
    else:
        scale = np.array([1e-3, 0.05, 1.0, 20.0], dtype=np.float32)
        mags = scale[(np.arange(rows * cols) // 32) % 4].reshape(rows, cols)
        values = (rng.uniform(-1.0, 1.0, size=(rows, cols)).astype(np.float32) * mags)
        if qtype == GGMLQuantizationType.F32:
            data = values
        elif qtype == GGMLQuantizationType.F16:
            data = values.astype(np.float16)
        else:
            data = quantize(values, qtype)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    deq = dequantize(data.reshape(rows, -1), qtype).astype("<f4").reshape(rows, cols)
    deq.tofile(f"{out}/{name}.deq")

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
