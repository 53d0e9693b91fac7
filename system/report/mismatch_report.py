"""The mismatch report of one batch dump: ``summary.json``, ``samples.json`` and ``report.html``.

Bounded in memory and output: the per-token work is vectorised over the ``[N, T]`` arrays
(a few float64 copies of them at the peak, no python object per token), figures are drawn
from binned counts, and ``samples.json`` holds token tables for the ``worst_k`` worst
responses only (``samples.py``). Both JSON files are strict JSON: undefined values are
``null``, never ``NaN``.

A dump whose mask selects no valid token (all masked out, or every masked-in log-prob
non-finite) is a legal batch: the report is written with every diagnostic ``null`` and a
notice on the page, and the command exits 0. Only an unreadable or malformed dump
(``DumpError``) is refused.
"""

import dataclasses
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from system.report import plots, strict_json
from system.report.dump import OPTIONAL_GRID, OPTIONAL_ROW, load_dump, require_memory
from system.report.html_page import render_page
from system.report.samples import DEFAULT_WORST_K, build_samples
from system.report.summary import build_summary, dump_ratios

REPORT_THREADS = 1
"""Torch threads while the report runs (restored after). Its torch work is a few memory-bound
passes over the batch; on a shared 2-core machine a second OpenMP thread cost more than it gave
(1M tokens: 2.8-3.2 s on one thread vs 2.9-4.5 s on two under load; 10M: 9.4 s vs 10.6 s)."""


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _valid_values(x_BT: torch.Tensor, valid: np.ndarray, all_valid: bool) -> np.ndarray:
    """The values at valid tokens as a flat array (a view when every token is valid)."""
    return x_BT.numpy().reshape(-1) if all_valid else x_BT.numpy()[valid]


def _figures(ratios, summary: dict) -> dict[str, dict]:
    """The page's four charts (none when there is no valid token)."""
    if summary["n_tokens"] == 0:
        return {}
    valid = ratios.valid_BT.numpy()
    all_valid = summary["n_tokens"] == valid.size
    figures = {"ratio_hist": plots.ratio_histogram(_valid_values(ratios.dc_BT, valid, all_valid))}
    behaviour = _valid_values(ratios.behaviour_BT, valid, all_valid)
    proximal = _valid_values(ratios.proximal_BT, valid, all_valid)
    with np.errstate(over="ignore"):  # a log-prob above ~88 (float32) is counted already (logp_above_zero)
        figures["prob_diff"] = plots.prob_diff_histogram(np.abs(np.exp(proximal) - np.exp(behaviour)))
    figures["density"] = plots.logprob_density(behaviour, proximal, summary["logp_pearson"])
    figures["keep_by_len"] = plots.keep_by_length(summary["methods"])
    return figures


REPORT_FILES = ("summary.json", "samples.json", "report.html")
"""What :func:`write_report` writes into its directory."""


def write_report(dump_path: str | Path, out_dir: str | Path, worst_k: int = DEFAULT_WORST_K) -> dict:
    """Write the three report files into ``out_dir``; return the summary (JSON-ready, None where
    undefined). ``worst_k``: responses whose full token tables go into samples.json. Raises
    DumpError on bad input."""
    dump = load_dump(dump_path)
    _check_report_fits_memory(dump.mask_BT.size, dump_path)
    with _torch_threads(REPORT_THREADS), torch.no_grad():
        ratios = dump_ratios(dump)
        samples = build_samples(dump, ratios, worst_k=worst_k)
        # The token grids served only the worst rows' tables: free them before the summary's peak.
        dump = dataclasses.replace(dump, token_text=None, response_ids=None)
        summary = strict_json.jsonable(build_summary(dump, ratios))
        figures = _figures(ratios, summary)
    del ratios, dump
    texts = dict(zip(REPORT_FILES, (strict_json.dumps(summary, indent=2),
                                    strict_json.dumps(samples, sanitize=False, separators=(",", ":")),
                                    render_page(str(dump_path), summary, samples, figures)), strict=True))
    write_all_or_none(Path(out_dir), texts)
    return summary


REPORT_BYTES_PER_POSITION = 100
"""What the report adds to the loaded dump at its peak, per token position of the ``[B, T]`` grid: 85 bytes
measured at 10 M positions (``benchmarks/results/report_scaling_cpu_amx.json``: 1.22 GB peak against 0.33 GB
for a 64 k one), with a margin."""


def _check_report_fits_memory(positions: int, dump_path) -> None:
    """Refuse, by name, a dump whose report would need more memory than is available now (a review found
    the load's check, on the arrays alone, passing dumps whose report then ran the machine out of
    memory, which kills the process without a message)."""
    need = REPORT_BYTES_PER_POSITION * positions
    require_memory(need, dump_path, f"its report needs about {need / 2**30:.3g} GiB ({positions} token positions, "
                                    f"~{REPORT_BYTES_PER_POSITION} bytes each)")


def write_all_or_none(out: Path, texts: dict[str, str]) -> None:
    """Write every ``name -> text`` into ``out`` or, if any write fails, none: each goes to a temporary
    file beside its target first, and the targets are replaced only once all are written (a
    failure leaves the previous report's files as they were and raises)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in texts:
        if (out / name).is_dir():  # the one failure a rename would meet after others were replaced
            raise IsADirectoryError(errno.EISDIR, "a directory has the report file's name", str(out / name))
    temps: dict[Path, Path] = {}
    try:
        for name, text in texts.items():
            temp = out / f".{name}.partial"
            temps[temp] = out / name
            temp.write_text(text, encoding="utf-8", errors="replace")  # a lone surrogate (a non-UTF-8 file name) -> ?
        for temp, target in temps.items():
            os.replace(temp, target)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)


def summary_line(summary: dict) -> str:
    """One line for the console; says so when there is no valid token (every diagnostic null), and
    names the archive's keys that are not dump keys (a misspelt optional key is otherwise unseen)."""
    ignored = summary.get("ignored_keys")
    # repr: a key name is the file's text, and control characters in it would reach the terminal
    note = (f"; ignored keys that are not dump keys: {', '.join(repr(k) for k in ignored)} (the optional keys: "
            f"{', '.join(OPTIONAL_ROW + OPTIONAL_GRID)})" if ignored else "")
    if summary["n_tokens"] == 0:
        return (f"no valid tokens ({summary['nonfinite_tokens']} masked-in tokens non-finite): "
                "every diagnostic is null" + note)
    kept = summary["methods"]["seq-mis"]["keep_seq_frac"]
    kl = summary["kl_k1"]
    bad = [f"{summary[key]} non-finite {what}" for key, what in
           (("reward_nonfinite", "reward(s), left out of reward_mean"),
            ("advantage_nonfinite", "advantage(s): the ais estimate is null")) if summary.get(key)]
    bad += [f"{n} masked-in {key} value(s) above 0 (a probability above 1; kept as valid tokens)"
            for key, n in (summary.get("logp_above_zero") or {}).items() if n]
    return (f"{summary['n_sequences']} of {summary.get('n_rows', summary['n_sequences'])} sequences with a valid "
            f"token, {summary['n_tokens']} tokens, "
            f"kl_k1 {'n/a' if kl is None else format(kl, '.3g')}, "
            f"seq-mis keeps {'n/a' if kept is None else format(kept, '.1%')} of sequences"
            + "".join(f"; {b}" for b in bad) + note)
