"""MoE grouped GEMM (op `grouped_matmul_sm100_persistent`): `op` (graph function
`grouped_matmul`), `layer` (`GroupedLinear`), `moe` (`MoEBlock`), `routing` (host token grouping
and SwiGLU weight layout), `contract`."""
