"""``aisrl report`` on archives that zipfile itself cannot open (a bad-input probe, 2026-12-01)."""

import numpy as np
from test_report import runner, said

from actors.cli import app
from system.report.demo_dump import make_demo_dump


def test_an_archive_zipfile_cannot_open_is_refused_naming_the_file(tmp_path):
    """A probe: an encrypted member (RuntimeError) and a compression method zipfile lacks
    (NotImplementedError) ended in tracebacks. Both are built from a real dump's bytes."""
    import zipfile

    plain = tmp_path / "plain.npz"
    np.savez(plain, **make_demo_dump(6, 5, seed=0))
    raw = bytearray(plain.read_bytes())
    with zipfile.ZipFile(plain) as zf:
        infos = zf.infolist()
    unknown = bytearray(raw)
    for info in infos:  # method 99 in every local header (offset + 8) and central header
        unknown[info.header_offset + 8: info.header_offset + 10] = (99).to_bytes(2, "little")
    central = raw.index(b"PK\x01\x02")
    while central >= 0:
        unknown[central + 10: central + 12] = (99).to_bytes(2, "little")
        central = raw.find(b"PK\x01\x02", central + 4)
    encrypted = bytearray(raw)
    for info in infos:  # the "encrypted" flag (bit 0 of the general-purpose flags)
        encrypted[info.header_offset + 6] |= 1
    central = raw.index(b"PK\x01\x02")
    while central >= 0:
        encrypted[central + 8] |= 1
        central = raw.find(b"PK\x01\x02", central + 4)
    for name, data, cause in (("unknown.npz", unknown, "NotImplementedError"), ("encrypted.npz", encrypted, "RuntimeError")):
        path = tmp_path / name
        path.write_bytes(bytes(data))
        result = runner.invoke(app, ["report", str(path), "--out", str(tmp_path / "o")])
        assert result.exit_code == 2, (name, result.output)
        assert f"{name}: not a readable .npz batch dump ({cause}" in said(result), said(result)


def test_an_archive_with_a_member_written_twice_is_refused_naming_it(tmp_path):
    """A review's finding: a zip holding ``rollout_logp.npy`` (the behaviour log-probs) twice, a good copy
    listed first and a damaged one last: which copy a check and a read see depends on the reader, and the
    report said only "not a readable .npz batch dump (ValueError: ... format version ...)", naming no
    member. zipfile writes such a file (with a warning); numpy.savez never does."""
    import warnings
    import zipfile

    good = tmp_path / "good.npz"
    dump = make_demo_dump(6, 5, seed=0)
    np.savez(good, **dump)
    twice = tmp_path / "twice.npz"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(twice, "w") as dst, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile's "Duplicate name" warning
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr("rollout_logp.npy", b"\x93NUMPY not an array")
    with zipfile.ZipFile(twice) as zf:  # the file really holds the name twice
        assert zf.namelist().count("rollout_logp.npy") == 2
    result = runner.invoke(app, ["report", str(twice), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "twice.npz: member 'rollout_logp.npy' appears 2 times in the archive" in said(result), said(result)
    ok = runner.invoke(app, ["report", str(good), "--out", str(tmp_path / "o2")])
    assert ok.exit_code == 0, ok.output  # the same dump written once reports
