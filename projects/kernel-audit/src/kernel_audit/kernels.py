"""The two Pallas kernels, their block sizes, checks and execution mode, in one namespace.

- `matmul_bias_act(x, w, b)` (`matmul.py`): `act(x @ w + b)` tiled over a
  `(M, N, K)` grid with a float32 VMEM accumulator and a fused epilogue.
- `layer_norm(x, gamma, beta)` (`layer_norm.py`): whole rows per block, one pass.
- `MatmulBlocks`, `RowBlocks`, `check_matmul`, `check_layer_norm`
  (`validation.py`): operands and blocks, checked before any kernel is traced,
  against the target's rules (`targets.py`: TPU block shapes, VMEM budget).
- `default_interpret`, `execution_mode` (`targets.py`): compiled (Mosaic) on a
  TPU, the Pallas interpreter everywhere else; every record names the mode.
"""

from kernel_audit.layer_norm import LAYER_NORM_EPS, layer_norm
from kernel_audit.matmul import activate, matmul_bias_act
from kernel_audit.targets import PRECISIONS, default_interpret, execution_mode
from kernel_audit.validation import (
    ACTIVATIONS,
    DTYPES,
    KernelInputError,
    MatmulBlocks,
    RowBlocks,
    check_layer_norm,
    check_matmul,
    fit_matmul_blocks,
    fit_row_blocks,
)

__all__ = [
    "ACTIVATIONS",
    "DTYPES",
    "LAYER_NORM_EPS",
    "PRECISIONS",
    "KernelInputError",
    "MatmulBlocks",
    "RowBlocks",
    "activate",
    "check_layer_norm",
    "check_matmul",
    "default_interpret",
    "execution_mode",
    "fit_matmul_blocks",
    "fit_row_blocks",
    "layer_norm",
    "matmul_bias_act",
]
