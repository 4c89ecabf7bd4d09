"""mojo-gemm: fast Mojo matmul kernels as MAX graph custom ops."""
