"""Per-response sums of a weight tensor over the valid tokens, for ``method_statistics`` (spec section 2).

One row per response i, over its valid tokens t (w promoted to float64):

    num_valid = T_i    num_kept = #(w > 0)    sum_w = sum w    sum_w_sq = sum w**2    max_w = max w (-inf if none)

On CPU a numba kernel reads w and the valid mask once (max on the IEEE bits as integers,
which vectorises); elsewhere torch. Reassociating these plain sums is harmless, so the
kernel may vectorise them.

Shapes: B = responses, T = padded length.
"""

import math

import numpy as np
import torch
from numba import njit

from system.correction.row_sums_kernel import from_ordered_bits, ordered_bits

WEIGHT_COLUMNS = ("num_valid", "num_kept", "sum_w", "sum_w_sq", "max_w")
"""The columns of ``weight_row_sums``, in order."""

_NEG_INF_KEY = np.int64(-0x7FF0000000000001)  # ordered_bits(-inf)


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz"})
def _weight_rows_kernel(w_BT, valid_BT, out_B5):
    for i in range(w_BT.shape[0]):
        w_T, valid_T = w_BT[i], valid_BT[i]
        num, kept, total, total_sq, max_key = 0, 0, 0.0, 0.0, _NEG_INF_KEY
        for t in range(w_T.shape[0]):
            valid = valid_T[t]
            w = np.float64(w_T[t]) if valid else 0.0
            num += valid
            kept += w > 0.0
            total += w
            total_sq += w * w
            max_key = max(max_key, ordered_bits(w) if valid else _NEG_INF_KEY)
        out_B5[i, 0] = num
        out_B5[i, 1] = kept
        out_B5[i, 2] = total
        out_B5[i, 3] = total_sq
        out_B5[i, 4] = from_ordered_bits(max_key)


def _weight_rows_torch(w_BT: torch.Tensor, valid_BT: torch.Tensor) -> torch.Tensor:
    w_BT = torch.where(valid_BT, w_BT.to(torch.float64), 0.0)
    max_BT = torch.where(valid_BT, w_BT, -math.inf)
    max_B = max_BT.amax(1) if w_BT.shape[1] else max_BT.new_full((w_BT.shape[0],), -math.inf)
    columns = [valid_BT.sum(1), (w_BT > 0).sum(1), w_BT.sum(1), w_BT.square().sum(1), max_B]
    return torch.stack([c.to(torch.float64) for c in columns], dim=1)


def weight_row_sums(
    w_BT: torch.Tensor, valid_BT: torch.Tensor, on_cpu_kernels: bool
) -> torch.Tensor:
    """float64 [B, 5]: the ``WEIGHT_COLUMNS`` of every response."""
    if not on_cpu_kernels:
        return _weight_rows_torch(w_BT, valid_BT)
    if w_BT.dtype not in (torch.float32, torch.float64):
        w_BT = w_BT.to(torch.float64)
    out_B5 = np.empty((w_BT.shape[0], len(WEIGHT_COLUMNS)))
    _weight_rows_kernel(w_BT.contiguous().numpy(), valid_BT.contiguous().numpy(), out_B5)
    return torch.from_numpy(out_B5)
