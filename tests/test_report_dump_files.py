"""``aisrl report``'s files: dumps refused by key or file (never a traceback, never unpickled),
strings decoded, a directory named, report files written all or none, and which dump a run's
fallback report takes. (The report's values are in ``test_report.py``.)"""

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from test_report import _outputs, _report, runner, said, strict_load

from actors.cli import app
from system.report.demo_dump import make_demo_dump
from system.report.dump import DumpError, load_dump, save_dump


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda a: a.pop("train_logp"), "train_logp"),
        (lambda a: a.__setitem__("response_mask", a["response_mask"][:, :-1]), "response_mask"),
        (lambda a: a.__setitem__("lag", a["lag"][:-1]), "lag"),
        (lambda a: [a.__setitem__(k, a[k][:0]) for k in list(a)], "empty batch"),
        (lambda a: a.__setitem__("rollout_logp", a["rollout_logp"][0]), "rollout_logp"),
        (lambda a: a["lag"].__setitem__(2, -1), "lag"),
        (lambda a: a.__setitem__("lag", a["lag"].astype(np.float32) + 0.5), "lag"),
        (lambda a: a.__setitem__("lag", a["lag"].astype(np.int64) + 2**31), "lag"),  # would wrap in int32
        # text or complex numbers under a numeric key: refused by key, not a traceback from astype
        (lambda a: a.__setitem__("reward", np.full(8, "1x")), "reward"),
        (lambda a: a.__setitem__("advantage", np.zeros(8, np.complex64)), "advantage"),
        (lambda a: a.__setitem__("response_ids", a["response_ids"].astype(np.float32)), "response_ids"),
        (lambda a: a.__setitem__("uid", np.zeros(8, np.complex64)), "uid"),
        # token ids beyond int32 wrapped silently (2**40 showed as token 0); negative ones are not ids
        (lambda a: a.__setitem__("response_ids", a["response_ids"].astype(np.int64) + 2**40), "response_ids"),
        (lambda a: a["response_ids"].__setitem__((0, 0), -3), "response_ids"),
        # a mask of durations was read as one (a probe: "30 tokens"); one of records raised a TypeError
        (lambda a: a.__setitem__("response_mask", a["response_mask"].astype("timedelta64[s]")), "response_mask"),
        (lambda a: a.__setitem__("response_mask", np.zeros(a["response_mask"].shape, [("a", "i4")])), "response_mask"),
        # lags of durations were read as integers (a probe: numpy counts timedelta64 as an integer type)
        (lambda a: a.__setitem__("lag", np.zeros(8, "m8[s]")), "lag"),
    ],
)
def test_bad_dumps_fail_naming_the_key_without_traceback(tmp_path, mutate, needle):
    arrays = make_demo_dump(8, 6, seed=1)
    mutate(arrays)
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert needle in said(result) and "Traceback" not in result.output
    with pytest.raises(DumpError, match="bad.npz"):
        load_dump(path)


def test_log_probs_above_zero_stay_valid_tokens_and_are_counted_and_said(tmp_path):
    """Spec section 0 makes a token valid by finiteness alone, so a log-prob above 0 (a probability
    above 1: an upstream bug, or random test data) is not refused (it was, from 2026-11-21 to -27) nor
    passed silently: summary.json counts it per key, the console and the page say so."""
    arrays = make_demo_dump(8, 6, seed=1)
    m = arrays["response_mask"]
    rows, cols = np.nonzero(m)
    arrays["rollout_logp"][rows[:3], cols[:3]] = [0.5, 2.0, 5e-4]  # 5e-4: within the 1e-3 rounding tolerance
    arrays["train_logp"][rows[-1], cols[-1]] = 2e-3
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    summary, _, page = _outputs(out)
    assert summary["logp_above_zero"] == {"rollout_logp": 2, "train_logp": 1}
    assert "2 masked-in rollout_logp value(s) above 0" in said(result) and "Log-probabilities above 0" in page
    assert "2 masked-in rollout and\n1 trainer log-probs exceed 0" in page  # each key's own count, in its place
    # the numbers are the spec's: d = old - mu over every finite masked-in token, positive ones included
    mu, old = arrays["rollout_logp"][m].astype(np.float64), arrays["train_logp"][m].astype(np.float64)
    assert summary["kl_k1"] == pytest.approx(float(np.mean(mu - old)), rel=1e-5)


def test_logp_rounding_padding_and_infinities_are_not_refused(tmp_path):
    arrays = make_demo_dump(8, 6, seed=1)
    m = arrays["response_mask"]
    arrays["rollout_logp"][0, 0] = 5e-4  # within the 1e-3 tolerance
    pad = np.argwhere(~m)[0]  # make_demo_dump pads: some row is shorter than 6
    arrays["train_logp"][tuple(pad)] = 7.0  # padding is never read
    arrays["train_logp"][1, 0] = np.inf  # non-finite: excluded and counted, not refused
    arrays["rollout_logp"][2, 0] = -np.inf
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    s, _, _ = _outputs(out)
    assert s["nonfinite_tokens"] == 2 and s["n_tokens"] == int(m.sum()) - 2


class _Trap:
    """Unpickling this would create a file: the loader must never unpickle."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_not_a_dump(tmp_path):
    marker = tmp_path / "unpickled"
    text = tmp_path / "x.npz"
    text.write_text("not a zip")
    pickled = tmp_path / "p.npz"
    pickled.write_bytes(pickle.dumps({"rollout_logp": _Trap(marker)}))
    single = tmp_path / "single.npz"
    with single.open("wb") as fh:
        np.save(fh, np.zeros((2, 2), np.float32))
    for path in (text, pickled, single):
        result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "o")])
        assert result.exit_code == 2 and path.name in said(result)
        assert "not an .npz archive" in said(result) and "pickled" not in said(result)
    result = runner.invoke(app, ["report", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no such file" in said(result)
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    result = runner.invoke(app, ["report", str(fifo), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "fifo.npz: not a regular file" in said(result)
    # An .npz whose uid is an object (pickled) array: refused naming the key, never unpickled.
    arrays = make_demo_dump(4, 3, seed=0)
    arrays["uid"] = np.array([_Trap(marker)] * 4, dtype=object)
    objects = tmp_path / "objects.npz"
    np.savez(objects, **arrays)
    result = runner.invoke(app, ["report", str(objects), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "'uid'" in said(result) and "object array" in said(result)
    assert not marker.exists()


def test_byte_strings_are_decoded_with_invalid_bytes_replaced(tmp_path):
    arrays = make_demo_dump(4, 3, seed=0)
    arrays["uid"] = np.array([b"\xff", b"ok", "é".encode(), b"a"], dtype="S2")
    arrays["token_text"] = np.where(arrays["response_mask"], b"\xfe", b"")
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    samples = strict_load(out / "samples.json")
    assert samples["sequences"]["uid"] == ["\ufffd", "ok", "é", "a"]  # U+FFFD replaces an invalid byte
    assert set(samples["worst"][0]["tokens"]["token"]) == {"\ufffd"}


def test_save_dump_stores_strings_as_unicode(tmp_path):
    arrays = make_demo_dump(4, 3, seed=0)
    arrays["uid"] = np.array(["a", "b", "c", "d"], dtype=object)
    dump = load_dump(save_dump(tmp_path / "d.npz", **arrays))
    assert dump.uid.dtype.kind == "U" and dump.uid.tolist() == ["a", "b", "c", "d"]
    arrays["uid"] = np.array([1, "b", None, "d"], dtype=object)
    with pytest.raises(DumpError, match="uid"):
        save_dump(tmp_path / "e.npz", **arrays)


def test_a_dump_the_disk_cannot_hold_names_itself_and_leaves_no_partial_file(tmp_path, monkeypatch):
    """Found by a probe: a full disk failed the run with "[Errno 28] No space left on device" naming no
    file, and left the hidden ``.step_N.npz.partial.npz`` behind."""
    def full(file, **arrays):
        Path(file).write_bytes(b"PK")  # the start of the archive, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", full)
    target = tmp_path / "dumps" / "step_000021.npz"
    with pytest.raises(OSError, match=r"\[Errno 28\] No space left on device: "
                                      r"'.*dumps/step_000021.npz'"):
        save_dump(target, **make_demo_dump(4, 3, seed=0))
    assert list((tmp_path / "dumps").iterdir()) == []


def test_a_directory_given_as_the_dump_names_its_dumps(tmp_path):
    run = tmp_path / "run"
    for step in (2, 4):
        save_dump(run / "dumps" / f"step_{step:06d}.npz", **make_demo_dump(3, 3, seed=step))
    result = runner.invoke(app, ["report", str(run), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "a directory, not a dump file" in said(result)
    squeezed = "".join(result.output.split())  # rich wraps long paths anywhere
    assert "dumps/step_000004.npz" in squeezed and "thelast" in squeezed
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["report", str(tmp_path / "empty"), "--out", str(tmp_path / "o2")])
    assert result.exit_code == 2 and "dumps/step_XXXXXX.npz" in "".join(result.output.split())


def test_a_failed_report_write_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    from system.report import mismatch_report

    result, out = _report(tmp_path, make_demo_dump(5, 4, seed=1))
    assert result.exit_code == 0, result.output
    before = {name: (out / name).read_bytes() for name in ("summary.json", "samples.json", "report.html")}
    # a directory now holds the page's name: refused before any file is replaced
    (out / "report.html").unlink()
    (out / "report.html").mkdir()
    result = runner.invoke(app, ["report", str(save_dump(tmp_path / "b.npz", **make_demo_dump(7, 4, seed=2))),
                                 "--out", str(out), "--overwrite"])
    assert result.exit_code == 2 and "cannot write the report" in said(result)
    assert "report.html" in "".join(result.output.split())
    assert {n: (out / n).read_bytes() for n in ("summary.json", "samples.json")} == \
        {n: before[n] for n in ("summary.json", "samples.json")}
    (out / "report.html").rmdir()
    (out / "report.html").write_bytes(before["report.html"])
    # the disk fills while the second file is written: nothing replaced, no partial file left
    real_write = Path.write_text
    calls = []

    def failing_write(self, *args, **kwargs):
        calls.append(self.name)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(self))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", failing_write)
    with pytest.raises(OSError, match="No space"):
        mismatch_report.write_report(tmp_path / "b.npz", out)
    monkeypatch.undo()
    assert {n: (out / n).read_bytes() for n in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "samples.json", "summary.json"]


def test_a_second_report_into_the_same_out_needs_overwrite(tmp_path):
    """A probe: ``aisrl report`` replaced a report already in ``--out`` without a word, where ``demo-dump``
    and ``export`` ask for ``--overwrite``."""
    result, out = _report(tmp_path, make_demo_dump(5, 4, seed=1))
    assert result.exit_code == 0, result.output
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    second = str(save_dump(tmp_path / "b.npz", **make_demo_dump(7, 4, seed=2)))
    refused = runner.invoke(app, ["report", second, "--out", str(out)])
    assert refused.exit_code == 2 and said(refused) == (
        f"error: --out {out} already holds a report (report.html, samples.json, summary.json): "
        "pass --overwrite to replace it"), said(refused)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    replaced = runner.invoke(app, ["report", second, "--out", str(out), "--overwrite"])
    assert replaced.exit_code == 0 and (out / "summary.json").read_bytes() != before["summary.json"]


def test_the_fallback_report_takes_the_newest_complete_dump_of_this_attempt(tmp_path):
    """Found by a review: the fallback (a process that dumped nothing: a resumed run already at its
    last step) took the newest ``step_*.npz``, which could be an interrupted save's temporary file or
    a dump of an attempt abandoned after the checkpoint the run resumed from."""
    from system.report.dump import newest_dump

    dumps = tmp_path / "dumps"
    for step in (2, 4, 6):
        save_dump(dumps / f"step_{step:06d}.npz", **make_demo_dump(2, 2, seed=step))
    (dumps / ".step_000008.npz.partial.npz").write_bytes(b"killed mid-save")
    (dumps / "step_000009.npz.tmp.npz").write_bytes(b"an older version's partial file")
    assert newest_dump(dumps) == dumps / "step_000006.npz"
    assert newest_dump(dumps, up_to_step=5) == dumps / "step_000004.npz"  # resumed at step 5
    assert newest_dump(dumps, up_to_step=1) is None and newest_dump(tmp_path / "none") is None
    # save_dump left no partial file of its own beside the three dumps (its temporary name is hidden)
    assert sorted(p.name for p in dumps.iterdir()) == [
        ".step_000008.npz.partial.npz", "step_000002.npz", "step_000004.npz", "step_000006.npz",
        "step_000009.npz.tmp.npz"]


def test_a_zip_member_that_is_not_an_npy_array_is_refused_by_key(tmp_path):
    """Found by a review: a member without the .npy format (numpy hands back its raw bytes) crashed the
    report with an AttributeError (exit 1) instead of a message naming the key (exit 2)."""
    import zipfile

    path = tmp_path / "odd.npz"
    np.savez(path, **make_demo_dump(4, 5, seed=2))
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("notes", b"raw bytes, not an array")
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "key 'notes' is not a .npy array" in said(result)


def test_misspelt_optional_keys_are_named_and_all_rows_counted(tmp_path):
    """Found by a review: ``lags=`` / ``rewards=`` were ignored without a word (by_lag all 0, no reward);
    and a dump whose rows had no valid token said "0 sequences" without saying how many rows it held."""
    arrays = make_demo_dump(6, 5, seed=3)
    arrays["lags"], arrays["rewards"] = arrays.pop("lag"), arrays.pop("reward")
    arrays["response_mask"][:2] = False  # two rows without a valid token
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    summary, _, html = _outputs(out)
    assert summary["ignored_keys"] == ["lags", "rewards"] and "reward_mean" not in summary
    assert (summary["n_rows"], summary["n_sequences"]) == (6, 4)
    assert "ignored keys that are not dump keys: 'lags', 'rewards'" in said(result)
    assert "4 of 6 sequences with a valid token" in said(result)
    assert "Keys ignored." in html and "lags, rewards" in html and "(of 6 in the dump)" in html


def test_padding_may_hold_any_token_id(tmp_path):
    # -100 (a common ignore index) at masked-out positions is never read: not refused
    arrays = make_demo_dump(4, 6, seed=4)
    arrays["response_ids"] = arrays["response_ids"].astype(np.int64)
    arrays["response_mask"][:, -1] = False
    arrays["response_ids"][:, -1] = -100
    result, _ = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output


def test_text_that_utf_8_cannot_hold_is_replaced_not_a_traceback(tmp_path):
    """Found by a probe: a dump file name that is not UTF-8 (a lone surrogate in Python) or a lone
    surrogate in prompt_text ended the report in ``UnicodeEncodeError`` with a traceback."""
    arrays = make_demo_dump(6, 4, seed=1)
    arrays["prompt_text"] = np.array(["ok", "\ud800 lone", "c", "d", "e", "f"])
    name = b"step_\xff.npz".decode("utf-8", "surrogateescape")  # what Python makes of such a file name
    result, out = _report(tmp_path, arrays, name=name)
    assert result.exit_code == 0, result.output
    _, samples, page = _outputs(out)
    assert "step_?.npz" in page and "? lone" in page  # the undecodable byte, the surrogate: replaced
    # samples.json is ASCII JSON: the surrogate stays an escape there, and reads back as it was
    assert "\ud800 lone" in json.dumps(samples, ensure_ascii=False), json.dumps(samples)[:300]


def test_large_finite_values_neither_overflow_the_reward_mean_nor_warn(tmp_path, recwarn):
    """Found by a probe: rewards of 3e38 (finite float32) summed in float32 to inf, so reward_mean was
    null while reward_nonfinite said 0; float64 log-probs beyond float32 printed numpy's overflow
    warning (they become +-inf: non-finite, excluded and counted)."""
    arrays = make_demo_dump(6, 4, seed=2)
    arrays["reward"] = np.full(6, 3e38, np.float32)
    arrays["rollout_logp"] = arrays["rollout_logp"].astype(np.float64)
    arrays["rollout_logp"][0, 0] = -1e300
    mask_00 = bool(arrays["response_mask"][0, 0])
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    summary, _, _ = _outputs(out)
    assert summary["reward_mean"] == pytest.approx(float(np.float32(3e38)), rel=1e-6) and summary["reward_nonfinite"] == 0
    assert summary["nonfinite_tokens"] == int(mask_00)
    assert "overflow" not in result.output and not [w for w in recwarn if "overflow" in str(w.message)]


def test_a_member_declaring_more_data_than_it_holds_is_refused_before_allocating(tmp_path):
    """Found by a probe: an .npy header declaring shape (10**7, 10**6) made numpy try to allocate 36 TiB
    (MemoryError traceback). The declared size is checked against the member's bytes first."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (10**7, 10**6)})
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("rollout_logp.npy", header.getvalue() + b"\0" * 64)
    with pytest.raises(DumpError, match=r"key 'rollout_logp' declares shape \(10000000, 1000000\) of float32 "
                                        r"\(40000000000000 bytes\) but holds 64 bytes"):
        load_dump(path)
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "declares shape" in said(result), result.output
    # an honest archive (compressed too) still loads
    good = save_dump(tmp_path / "good.npz", **make_demo_dump(4, 3, seed=1))
    assert load_dump(good).shape == (4, 3)
    arrays = make_demo_dump(4, 3, seed=1)
    np.savez_compressed(tmp_path / "z.npz", **arrays)
    assert load_dump(tmp_path / "z.npz").shape == (4, 3)


def test_dump_text_can_neither_turn_the_page_nor_the_terminal(tmp_path):
    """Found by a probe: a right-to-left override (U+202E) in a uid reversed the rest of its summary
    line on the page (the numbers and the keeps/rejects verdict), and a key name holding terminal
    escapes set the terminal's title and colours through the console line. Dump text now sits in
    <bdi> (isolated direction) and key names are printed as repr."""
    arrays = make_demo_dump(4, 5, seed=2)
    arrays["uid"] = np.array([f"u{i}\u202e44" for i in range(4)])
    arrays["prompt_text"] = np.array(["\u202eevil"] * 4)
    arrays["\x1b]0;PWNED\x07\x1b[31mRED\x1b[0m"] = np.zeros(4)
    result, out = _report(tmp_path, arrays)
    assert result.exit_code == 0, result.output
    _, _, html = _outputs(out)
    assert "uid <bdi>u0\u202e44</bdi>: mean |diff|" in html
    assert '<pre class="text"><bdi>\u202eevil</bdi></pre>' in html and "bdi{unicode-bidi:isolate}" in html
    assert "\x1b" not in result.output and "'\\x1b]0;PWNED\\x07\\x1b[31mRED\\x1b[0m'" in said(result)


def test_an_archive_larger_uncompressed_than_the_memory_available_is_refused(tmp_path, monkeypatch):
    """A few MB of compressed zeros can stand for many GB of arrays, each read whole: an archive whose
    members exceed the memory available is refused by name before any is read. Here 3 members of
    1000 x 1000 (float32 4 MB, float32 4 MB, bool 1 MB, each + a 128-byte .npy header) compress to
    tens of KB, against a stated 8 MB available."""
    import system.report.dump as dump

    zeros = np.zeros((1000, 1000), np.float32)
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, rollout_logp=zeros, train_logp=zeros, response_mask=zeros.astype(bool))
    assert path.stat().st_size < 100_000
    monkeypatch.setattr(dump, "available_memory_bytes", lambda: 8 * 2**20)
    with pytest.raises(DumpError, match=r"bomb\.npz: its arrays hold 0\.00838 GiB uncompressed \(0\.0\d+ MiB in the "
                                        r"file\), more than the 0\.0078\d* GiB of memory available now"):
        load_dump(path)
    result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "of memory available now" in said(result), result.output
    monkeypatch.setattr(dump, "available_memory_bytes", lambda: 10 * 2**20)  # 9 MB fit in 10
    assert load_dump(path).shape == (1000, 1000)
    monkeypatch.setattr(dump, "available_memory_bytes", lambda: None)  # unknown: not checked
    assert load_dump(path).shape == (1000, 1000)
    monkeypatch.undo()
    assert dump.available_memory_bytes() > 2**20  # this machine's reading is a number of bytes


