"""A per-response weight spread over the response's valid tokens: ``w_BT[i, t] = w_B[i]`` if valid, else 0.

Every sequence-level method of spec section 2 ends with this [B, T] write; on CPU a numba
loop does it in one vectorised pass over the valid mask, elsewhere ``torch.where``.

Shapes: B = responses, T = padded length.
"""

import torch
from numba import njit


@njit(cache=True, nogil=True)
def _fill_rows(valid_BT, w_B, out_BT):
    for i in range(valid_BT.shape[0]):
        valid_T, out_T, w = valid_BT[i], out_BT[i], w_B[i]
        for t in range(valid_T.shape[0]):
            out_T[t] = w if valid_T[t] else 0.0


def spread_over_valid(
    w_B: torch.Tensor, valid_BT: torch.Tensor, on_cpu_kernels: bool
) -> torch.Tensor:
    """[B, T] in the dtype of ``w_B`` (float32 or float64): w_B[i] at the valid tokens of i, 0 elsewhere."""
    if not on_cpu_kernels:
        return torch.where(valid_BT, w_B[:, None], 0.0)
    out_BT = torch.empty(valid_BT.shape, dtype=w_B.dtype)
    _fill_rows(valid_BT.contiguous().numpy(), w_B.contiguous().numpy(), out_BT.numpy())
    return out_BT
