"""FP8 (float8_e4m3fn) quantization: `quant` (host blockwise / input quantizers, `Fp8Blockwise`),
`op` (graph function `quantize_fp8_rows`), `contract`."""
