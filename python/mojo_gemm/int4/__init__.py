"""W4A16 (GPTQ/AWQ int4 weights, op `multistage_gemm_q`): `op` (graph function `int4_matmul`),
`layer` (`Int4Linear`), `contract`, `quant` (host `Int4Weight`), `layout` (the packed layout),
`checkpoint_formats` (GPTQ / AWQ bit unpacking), `plan` (`int4_gpu_plan`)."""
