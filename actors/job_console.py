"""What ``aisrl submit`` and ``aisrl job`` print: aisrl's lines, not Ray's client INFO lines.

Ray's job client logs at INFO to the console: the package upload ("Uploading package gcs://...",
"Creating a file package ...", "Ignoring upload to cluster for these files ..."), and after
``--follow`` "WebSocket closed for job ...". Its job supervisor writes INFO lines of its own into
the job's log ("Runtime env is setting up."), which ``--follow`` streams. Without ``--verbose``
(``AISRL_VERBOSE``) the client's loggers are set to WARNING and the streamed log leaves out lines in
Ray's INFO format; Ray's warnings and errors, and every line of the job itself, are kept.
``aisrl job logs`` prints the log as Ray keeps it.
"""

import logging
import re
from collections.abc import AsyncIterator

RAY_CLIENT_LOGGERS = ("ray", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk")
"""``ray`` (its child loggers follow it, e.g. the packaging one) and the two that set INFO themselves."""

RAY_INFO_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+INFO \S+\.py:\d+ -- ")
"""A line Ray's own logging wrote at INFO, e.g. ``2026-11-28 03:33:20,200\\tINFO job_manager.py:581 -- ...``."""


def quiet_client_loggers() -> None:
    """Ray's job-client loggers to WARNING (call after importing ``ray.job_submission``)."""
    for name in RAY_CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


async def without_ray_info(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """``chunks`` of a streamed log with Ray's INFO lines left out. A line split across chunks is held
    until its end arrives (or the stream ends or breaks). (A line rewritten with ``\\r``, a progress
    bar, arrives whole at its end: without ``--verbose`` the job's progress bars are off.)"""
    held = ""
    try:
        async for chunk in chunks:
            lines = (held + chunk).split("\n")
            held = lines.pop()
            kept = [line + "\n" for line in lines if not RAY_INFO_LINE.match(line)]
            if kept:
                yield "".join(kept)
    except Exception:  # the stream broke: what it had sent is still shown
        if held and not RAY_INFO_LINE.match(held):
            yield held
        raise
    if held and not RAY_INFO_LINE.match(held):
        yield held
