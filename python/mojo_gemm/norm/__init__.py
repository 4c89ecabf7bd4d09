"""Residual add + RMSNorm + cast in one op (ops `rms_norm_rows`, `add_rms_norm_rows`): `op`
(graph function `add_rms_norm`), `contract`."""
