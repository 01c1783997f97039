"""Pallas kernels (a fused matmul, a layer norm) audited against independent
references, with interpreted and compiled execution declared apart."""
