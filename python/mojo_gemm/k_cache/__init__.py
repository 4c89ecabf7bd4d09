"""FP8 K/V projection into MAX's paged KV cache (ops `k_matmul_ragged_paged_scale`, its V twin
`v_matmul_ragged_paged_scale` and both fused, `kv_matmul_ragged_paged_scale`): `op` (graph
functions), `layer` (`PagedKVProjection`), `contract`, `plan` (`k_cache_gpu_plan`)."""
