"""kerneltune: autotuned Triton RMSNorm kernels."""
