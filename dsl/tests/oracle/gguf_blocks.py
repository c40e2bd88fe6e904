"""llama.cpp's own numpy quantizers (PyPI `gguf`, `gguf.quants`) as an oracle.

Reads rows x cols little-endian f32 from IN, and for each of Q4_0, Q4_1 and
Q8_0 writes OUT/<type>.blocks (gguf's quantized bytes) and OUT/<type>.deq
(gguf's dequantization of those bytes, f32). Usage:
    python3 gguf_blocks.py IN ROWS COLS OUT
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

src, rows, cols, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
data = np.fromfile(src, dtype="<f4").reshape(rows, cols)
for name in ("Q4_0", "Q4_1", "Q8_0"):
    qtype = GGMLQuantizationType[name]
    blocks = quantize(data, qtype)
    blocks.tofile(f"{out}/{name}.blocks")
    dequantize(blocks, qtype).astype("<f4").tofile(f"{out}/{name}.deq")
