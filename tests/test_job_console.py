"""``actors.job_console``: Ray's job-client INFO lines off the console, Ray's INFO lines out of a
followed job log, everything else kept (the real submission: ``tests/test_jobs.py``)."""

import asyncio
import logging

import pytest

from actors import jobs
from actors.job_console import RAY_CLIENT_LOGGERS, without_ray_info

# lines as a followed job printed them (2026-11-28); the first is Ray's job supervisor, the others the job's
SUPERVISOR = "2026-11-28 03:33:20,200\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
OWN = ["Running entrypoint for job raysubmit_5hct9vtgDT3xXT6p: aisrl train aisrl_job_config.json\n",
       "joined the Ray cluster at 127.0.0.1:43849 (ray.address=auto)\n",
       "2026-11-28 03:33:21,000\tWARNING worker.py:1 -- a warning Ray wants seen\n",
       "step 1 INFO -- a line of the job that merely says INFO\n"]


def streamed(chunks: list[str]) -> str:
    async def source():
        for chunk in chunks:
            yield chunk

    async def collect():
        return "".join([c async for c in without_ray_info(source())])

    return asyncio.run(collect())


def test_a_followed_log_loses_rays_info_lines_only():
    text = SUPERVISOR + "".join(OWN)
    assert streamed([text]) == "".join(OWN)
    # split anywhere (mid-line, mid-timestamp) the result is the same; a last line without its newline is kept
    for cut in (5, 30, len(SUPERVISOR) + 3, len(text) - 2):
        assert streamed([text[:cut], text[cut:]]) == "".join(OWN)
    assert streamed([text + "done: 1 steps"]) == "".join(OWN) + "done: 1 steps"
    assert streamed([SUPERVISOR.rstrip("\n")]) == ""


def test_a_stream_that_breaks_still_shows_what_it_sent():
    async def source():
        yield OWN[0] + "half a li"
        raise RuntimeError("websocket closed abnormally")

    async def collect(out):
        async for c in without_ray_info(source()):
            out.append(c)

    out: list[str] = []
    with pytest.raises(RuntimeError, match="abnormally"):
        asyncio.run(collect(out))
    assert "".join(out) == OWN[0] + "half a li"


@pytest.fixture
def ray_loggers():
    """Ray's job-client loggers at INFO, as Ray leaves them; their levels restored afterwards."""
    loggers = [logging.getLogger(name) for name in RAY_CLIENT_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO)
    yield loggers
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


def test_the_job_client_logs_warnings_only_unless_verbose(ray_loggers, monkeypatch):
    loggers = ray_loggers
    monkeypatch.setenv("AISRL_VERBOSE", "1")
    with pytest.raises(jobs.JobError, match="cannot reach"), jobs.job_api("http://127.0.0.1:9"):  # closed port
        pass
    assert [lg.level for lg in loggers] == [logging.INFO] * 3  # --verbose: Ray's lines as Ray logs them
    monkeypatch.delenv("AISRL_VERBOSE")
    with pytest.raises(jobs.JobError, match="cannot reach"), jobs.job_api("http://127.0.0.1:9"):
        pass  # set before the client connects
    assert [lg.level for lg in loggers] == [logging.WARNING] * 3
    # the upload lines come from a child of "ray", which follows it
    assert not logging.getLogger("ray._private.runtime_env.packaging").isEnabledFor(logging.INFO)
