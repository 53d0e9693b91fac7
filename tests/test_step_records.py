"""The driver's check of the step records it sent to the correction service (``RecordsInFlight``), with
no Ray cluster: calls are ``tests/controller_fakes.py`` references (ended at once, failed, or held until
released), through the same runtime interface as Ray's (``actors.runtime``). The loopback-cluster
version of the first case, with a real actor, is in ``tests/test_run_lifecycle.py``."""

import pytest
from controller_fakes import CallFailed, InProcessRuntime, Ref, WorkerDied

from actors.step_records import RecordsInFlight, RecordsLostError


def held(value):
    """A record call that has not ended yet (a ``finish_step`` still writing)."""
    return Ref(run=lambda: value)


def test_a_check_waits_for_records_still_writing_only_when_told_to():
    records = RecordsInFlight(InProcessRuntime())
    records.sent(1, Ref(None))
    slow = held(None)
    records.sent(2, slow)
    records.check()  # step 1 written, step 2 still writing: no error, no wait
    records.check()
    assert not slow.ready  # a check without wait never waits
    records.check(wait=True)  # before a checkpoint: waits for step 2
    assert slow.ready


def test_the_first_record_that_failed_stops_the_run_naming_its_step():
    records = RecordsInFlight(InProcessRuntime())
    records.sent(3, Ref(error=CallFailed("[Errno 21] Is a directory: '/run/metrics.jsonl'")))
    records.sent(4, Ref(error=CallFailed("bad shard")))
    with pytest.raises(RecordsLostError, match=r"the record of step 3 could not be written \(.*metrics\.jsonl"):
        records.check()


def test_a_record_that_fails_while_it_is_waited_for_stops_the_run():
    records = RecordsInFlight(InProcessRuntime())
    records.sent(5, Ref(None))

    def fail():
        raise CallFailed("no space left on device")

    records.sent(6, Ref(run=fail))
    records.check()  # 5 written, 6 still writing: kept, not taken for written
    with pytest.raises(RecordsLostError, match=r"the record of step 6 could not be written \(no space left"):
        records.check(wait=True)  # the wait sees it end, failed


def test_a_record_lost_with_the_service_names_the_service_not_rays_whole_text():
    """Found by a review: a correction service that died (its process killed) made the check raise Ray's
    actor-death error as it is (its ids and a paragraph of causes); it now says the service is gone."""
    records = RecordsInFlight(InProcessRuntime())
    text = ("The actor died unexpectedly before finishing this task. class_name: CorrectionServiceActor "
            "actor_id: 3f pid: 4242 namespace: x ip: 127.0.0.1 Worker exit type: SYSTEM_ERROR Worker exit detail: "
            "The leased worker has unrecoverable failure. Worker is requested to be destroyed. More text.")
    records.sent(7, Ref(error=WorkerDied(text)))
    with pytest.raises(RecordsLostError, match=r"the record of step 7 could not be written: the correction "
                       r"service is gone \(its process \(pid 4242 on 127\.0\.0\.1\) died: SYSTEM_ERROR"):
        records.check()
