"""Example models built from mojo-gemm's layers, with float64 numpy references (`reference`)."""
