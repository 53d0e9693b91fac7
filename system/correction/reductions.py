"""Reductions over the valid entries of a batch, returned as JSON-ready python numbers.

    ess(x)    = (sum x)**2 / (n * sum x**2)        (spec section 1, ``ess_token``)
    median(x) = numpy's median: the middle value, or the average of the two middle values
    fraction by bucket = #(hit and in bucket) / #(in bucket), buckets of length or position

Every reduction here runs in float64 on tensors that are already 0 (or masked) where not
valid, and returns ``None`` instead of NaN when it is undefined.

Shapes: the README's legend (B responses, T padded length, N a flat count, M a subset of an N).
"""

import math

import numpy as np
import torch

LENGTH_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<=128", 128),
    ("<=512", 512),
    ("<=2048", 2048),
    (">2048", float("inf")),
)
"""Length (or position) buckets as (key, inclusive upper edge); a bucket starts after the previous edge."""

_BAND_MIN_SIZE = 1 << 16
"""Up to this many values ``kth_smallest`` searches them all directly."""
_BAND_SAMPLE_SIZE = 16384
"""This many sampled values bracket the wanted ranks."""
_BAND_SEED = 0x5EED


def as_float(value: torch.Tensor) -> float:
    """A 0-d tensor as a python float."""
    return float(value.item())


def ess_fraction(x_N: torch.Tensor, count: int) -> float | None:
    """``(sum x)**2 / (count * sum x**2)`` with x = 0 at excluded entries; None if count is 0, 0 if all x are 0."""
    if count == 0:
        return None
    x_N = x_N.to(torch.float64)
    sum_sq = x_N.square().sum()
    if sum_sq.item() == 0.0:
        return 0.0
    return min(as_float(x_N.sum().square() / (count * sum_sq)), 1.0)  # <= 1 up to rounding


def _select(values_N: torch.Tensor, ranks: list[int]) -> list[float]:
    """Exact order statistics (1-indexed ranks): numpy's introselect on CPU (linear in the
    worst case, unlike ``kthvalue``'s quickselect on reversed inputs), a sort elsewhere."""
    if values_N.device.type == "cpu":
        partitioned_N = np.partition(values_N.detach().numpy(), [rank - 1 for rank in ranks])
        return [float(partitioned_N[rank - 1]) for rank in ranks]
    sorted_N = values_N.sort().values
    return [float(sorted_N[rank - 1]) for rank in ranks]


def kth_smallest(values_N: torch.Tensor, ranks: list[int]) -> list[float]:
    """The values of the 1-indexed ``ranks`` in ascending order of the flat ``values_N``.

    Large inputs: a sample at pseudo-random positions (fixed seed, so results and timings
    repeat) brackets the ranks, one pass counts the values below the bracket and keeps the few
    inside it, and only those are searched. Exact whatever happens: if the bracket misses, the
    whole array is searched. (A strided sample would see only a few columns of a ``[B, T]``
    batch whose row length the stride divides, and miss its bracket on position-dependent data.)
    """
    num = values_N.numel()
    if num <= _BAND_MIN_SIZE:
        return _select(values_N, ranks)
    positions_M = torch.randint(num, (_BAND_SAMPLE_SIZE,), generator=torch.Generator().manual_seed(_BAND_SEED))
    sample_M = values_N[positions_M.to(values_N.device)]
    size = sample_M.numel()
    margin = 2.5 * math.sqrt(size) + 8.0  # >= 5 binomial std of a sample rank
    rank_lo = math.floor(min(ranks) / num * size - margin)
    rank_hi = math.ceil(max(ranks) / num * size + margin)
    keep_N = torch.ones_like(values_N, dtype=torch.bool)
    num_below = 0
    if rank_lo >= 1:
        keep_N = values_N >= _select(sample_M, [rank_lo])[0]
        num_below = num - int(keep_N.sum().item())
    if rank_hi <= size:
        keep_N &= values_N <= _select(sample_M, [rank_hi])[0]
    band_M = values_N[keep_N]
    if num_below < min(ranks) and max(ranks) <= num_below + band_M.numel():
        return _select(band_M, [rank - num_below for rank in ranks])
    return _select(values_N, ranks)


def median_of_nonnegative(values_BT: torch.Tensor, count: int) -> float | None:
    """numpy's median over the ``count`` valid entries of ``values_BT``, without compacting them.

    Precondition: valid entries are >= 0 and every other entry is exactly 0. The invalid
    zeros then sort first, so the k-th smallest valid value is the (k + num_invalid)-th
    smallest of the whole array.
    """
    if count == 0:
        return None
    flat_N = values_BT.reshape(-1)
    offset = flat_N.numel() - count
    if count % 2 == 1:
        return kth_smallest(flat_N, [offset + (count + 1) // 2])[0]
    lower, upper = kth_smallest(flat_N, [offset + count // 2, offset + count // 2 + 1])
    return (lower + upper) / 2


def count_by_bucket(lengths_N: torch.Tensor, counted_N: torch.Tensor) -> dict[str, int]:
    """Per length bucket (``LENGTH_BUCKETS``): how many counted entries fall in it."""
    out, lower = {}, 0.0
    for key, upper in LENGTH_BUCKETS:
        out[key] = int((counted_N & (lengths_N > lower) & (lengths_N <= upper)).sum().item())
        lower = upper
    return out


def fraction_by_bucket(
    hit_N: torch.Tensor, lengths_N: torch.Tensor, counted_N: torch.Tensor
) -> dict[str, float | None]:
    """Per length bucket: the fraction of counted entries that hit; None for an empty bucket."""
    out: dict[str, float | None] = {}
    lower = 0.0
    for key, upper in LENGTH_BUCKETS:
        in_bucket_N = counted_N & (lengths_N > lower) & (lengths_N <= upper)
        num = int(in_bucket_N.sum().item())
        out[key] = None if num == 0 else int((hit_N & in_bucket_N).sum().item()) / num
        lower = upper
    return out
