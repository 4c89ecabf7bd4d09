"""Custom ops of mojo-gemm for MAX graphs (custom_extensions=[Path("mojo_kernels")]).

The registered ops live in registrations.mojo; kernels under int4_gemm/ and common/.
"""
