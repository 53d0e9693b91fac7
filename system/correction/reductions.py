"""Reductions over the valid entries of a batch, returned as JSON-ready python numbers.

    ess(x)    = (sum x)**2 / (n * sum x**2)        (spec section 1, ``ess_token``)
    median(x) = numpy's median: the middle value, or the average of the two middle values

Every reduction here runs in float64 on tensors that are already 0 (or masked) where not
valid, and returns ``None`` instead of NaN when it is undefined.

Shapes: B = responses, T = padded length, N = any flat count.
"""

import torch

LENGTH_BUCKETS: tuple[tuple[str, float], ...] = (
    ("<=128", 128),
    ("<=512", 512),
    ("<=2048", 2048),
    (">2048", float("inf")),
)
"""Length (or position) buckets as (key, inclusive upper edge); a bucket starts after the previous edge."""


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
    return as_float(x_N.sum().square() / (count * sum_sq))


def median_of_valid(values_BT: torch.Tensor, valid_BT: torch.Tensor, count: int) -> float | None:
    """numpy's median of ``values`` over the ``count`` valid entries, without compacting them.

    Invalid entries are filled with -inf, so in sorted order they come first and the k-th
    smallest valid value is the (k + num_invalid)-th smallest of the whole array.
    """
    if count == 0:
        return None
    flat_N = torch.where(valid_BT, values_BT, float("-inf")).reshape(-1)
    offset = flat_N.numel() - count
    lower = flat_N.kthvalue(offset + (count + 1) // 2).values
    if count % 2 == 1:
        return as_float(lower)
    # Upper middle: the lower one again if enough entries tie with it, else the next larger value.
    num_at_most_lower = int((flat_N <= lower).sum().item())
    if num_at_most_lower >= offset + count // 2 + 1:
        upper = lower
    else:
        upper = torch.where(flat_N > lower, flat_N, float("inf")).min()
    return as_float((lower + upper) / 2)


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
