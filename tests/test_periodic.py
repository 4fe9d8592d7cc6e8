"""Periodic jobs: when they are due (pure functions), their firing on a real Postgres (exactly once between
concurrent firers, catch-up, overlap), and three real nodes firing one of them while a node is killed.

The end-to-end test counts what the crawls themselves record (runs.jsonl), not what the API says.
"""

from __future__ import annotations

import datetime
import threading
import time
from types import SimpleNamespace

import pytest

from helpers import query, runs, wait_for
from scrapyd_pgqueue import cli
from scrapyd_pgqueue.job_rules.job_requests import RefusedJob
from scrapyd_pgqueue.job_rules.periodic_jobs import PeriodicJob, periodic_job
from scrapyd_pgqueue.job_rules.timing import InvalidScheduleError, Timing, check_timing, first_due_after
from scrapyd_pgqueue.node.periodic import MAX_SLEEP, MIN_SLEEP, PeriodicFirer
from scrapyd_pgqueue.store import JobStore, ScheduleStore, WatchdogLimits

UTC = datetime.timezone.utc


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


# --- timing (pure) -----------------------------------------------------------------------------------------------


def test_every_n_seconds_stays_on_its_grid_and_catches_up_once():
    every = Timing(every_seconds=10)
    start = at("2026-11-23T12:00:00+00:00")
    assert first_due_after(every, start) == at("2026-11-23T12:00:10+00:00")  # a new schedule: now + N
    # Fired a little late: the next due time is on the grid, not late + N (no drift).
    assert first_due_after(every, at("2026-11-23T12:00:10.7+00:00"), at("2026-11-23T12:00:10+00:00")) == at(
        "2026-11-23T12:00:20+00:00"
    )
    # 95 s late (nine due times missed): one firing now, then the first grid time after now.
    assert first_due_after(every, at("2026-11-23T12:01:45+00:00"), at("2026-11-23T12:00:10+00:00")) == at(
        "2026-11-23T12:01:50+00:00"
    )
    # Exactly on a grid time: strictly after now.
    assert first_due_after(every, at("2026-11-23T12:00:20+00:00"), at("2026-11-23T12:00:10+00:00")) == at(
        "2026-11-23T12:00:30+00:00"
    )


def test_cron_is_read_in_its_time_zone_across_a_daylight_saving_change():
    nightly = Timing(cron="0 3 * * *", timezone="Europe/Paris")
    # 03:00 in Paris is 02:00 UTC in winter (CET) and 01:00 UTC from 29 March 2026 (CEST).
    assert first_due_after(nightly, at("2026-03-27T12:00:00+00:00")) == at("2026-03-28T02:00:00+00:00")
    assert first_due_after(nightly, at("2026-03-28T12:00:00+00:00")) == at("2026-03-29T01:00:00+00:00")
    # After an outage of several days: the next match after now, once (not once per missed night).
    missed = first_due_after(nightly, at("2026-04-05T12:00:00+00:00"), at("2026-03-29T01:00:00+00:00"))
    assert missed == at("2026-04-06T01:00:00+00:00")
    assert first_due_after(Timing(cron="*/15 * * * *"), at("2026-11-23T12:07:00+00:00")) == at(
        "2026-11-23T12:15:00+00:00"
    )


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        (Timing(cron="61 * * * *"), "invalid cron expression"),
        (Timing(cron="every day"), "invalid cron expression"),
        (Timing(cron="0 3 * * *", timezone="Mars/Olympus"), "unknown time zone"),
        (Timing(cron="0 3 * * *", every_seconds=5), "not both or neither"),
        (Timing(), "not both or neither"),
        (Timing(every_seconds=0.5), "at least 1 second"),
        (Timing(every_seconds=float("inf")), "must be a number of seconds"),
        (Timing(every_seconds=1e300), "at most 315360000 seconds"),
    ],
)
def test_bad_timings_are_refused_with_the_reason(timing, message):
    with pytest.raises(InvalidScheduleError, match=message):
        check_timing(timing)


def test_the_firer_sleeps_until_the_next_due_time_within_its_bounds():
    firer = PeriodicFirer.__new__(PeriodicFirer)
    firer.settings = SimpleNamespace(poll_interval=5.0)
    firer.listener = SimpleNamespace(poll_only=threading.Event())
    assert firer.sleep_for(3.5) == 3.5
    assert firer.sleep_for(-2) == MIN_SLEEP  # still due: another node is firing it right now
    assert firer.sleep_for(3600) == firer.sleep_for(None) == MAX_SLEEP  # new schedules are seen, NOTIFY or not
    firer.listener.poll_only.set()  # behind PgBouncer, no NOTIFY: look for new schedules every poll_interval
    assert firer.sleep_for(3600) == 5.0
    firer.ticked = True  # the node's tick reads the next due time every heartbeat: no floor timer of its own
    assert firer.sleep_for(3600) == 3600 and firer.sleep_for(-2) == MIN_SLEEP
    assert firer.sleep_for(None) is None  # nothing scheduled: no timer, the tick says when something is


# --- the store on a real Postgres --------------------------------------------------------------------------------


@pytest.fixture
def schedules(database_url):
    return ScheduleStore.for_url(database_url)


def make_due(url, name, seconds_ago=0.0):
    query(url, "UPDATE periodic_job SET next_fire_time = now() - make_interval(secs => %s) WHERE name = %s",
          (seconds_ago, name))


def fired_jobs(url, name):
    return query(url, "SELECT job, status, message, priority FROM spider_job WHERE periodic = %s ORDER BY id", (name,))


def test_a_fired_job_looks_like_one_schedule_json_queued(database_url, schedules):
    schedules.add_periodic(PeriodicJob("daily", "p", "s", Timing(every_seconds=60), priority=3,
                                       args={"page": "1"}, settings={"DOWNLOAD_DELAY": "2"}))
    make_due(database_url, "daily")
    firing = schedules.fire_due()
    [(job, status, message, priority)] = fired_jobs(database_url, "daily")
    assert [fired.job for fired in firing.fired] == [job] and status == "pending" and priority == 3
    assert message == {"page": "1", "name": "s", "_job": job, "settings": {"DOWNLOAD_DELAY": "2"}}
    assert len(job) == 32 and 59 < firing.next_due_in <= 60
    [claimed] = JobStore.for_url(database_url).claim_next_jobs(["p"], 1, node="n", worker="w").jobs
    assert claimed.message == message


def test_a_periodic_job_s_watchdog_limits_reach_each_fired_job_and_its_node(database_url, schedules):
    schedules.add_periodic(periodic_job("bounded", "p", "s", every=60, max_runtime="30", stall_timeout=600))
    [listed] = schedules.list_periodic("p")
    assert (listed.max_runtime, listed.stall_timeout) == (30.0, 600.0)
    make_due(database_url, "bounded")
    schedules.fire_due()
    store = JobStore.for_url(database_url)
    [claimed] = store.claim_next_jobs(["p"], 1, node="n", worker="w").jobs
    now = datetime.datetime.now()
    assert store.mark_started(claimed, worker="w", pid=1, start_time=now) == WatchdogLimits(30.0, 600.0)
    with pytest.raises(RefusedJob, match="stall_timeout must be more than 0"):
        periodic_job("stuck", "p", "s", every=60, stall_timeout=0)


def test_concurrent_firers_fire_each_due_time_exactly_once(database_url, schedules):
    schedules.add_periodic(PeriodicJob("often", "p", "s", Timing(every_seconds=3600), overlap="queue"))
    firers = 6
    for round_ in range(15):
        make_due(database_url, "often")
        barrier = threading.Barrier(firers)
        results = []

        def fire():
            barrier.wait()
            results.append(schedules.fire_due())

        threads = [threading.Thread(target=fire) for _ in range(firers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(len(result.fired) for result in results) == 1, f"round {round_}"
    assert len(fired_jobs(database_url, "often")) == 15
    assert query(database_url, "SELECT fired, skipped FROM periodic_job") == [(15, 0)]


def test_after_an_outage_a_schedule_fires_once_and_resumes_on_its_grid(database_url, schedules):
    schedules.add_periodic(PeriodicJob("grid", "p", "s", Timing(every_seconds=10), overlap="queue"))
    make_due(database_url, "grid", seconds_ago=95)  # nine due times missed while every node was down
    [(missed,)] = query(database_url, "SELECT next_fire_time FROM periodic_job")
    firing = schedules.fire_due()
    assert len(firing.fired) == 1 and firing.fired[0].due == missed
    [(next_time, fired)] = query(database_url, "SELECT next_fire_time, fired FROM periodic_job")
    assert next_time - missed == datetime.timedelta(seconds=100) and fired == 1  # the grid, not now + 10 s
    assert schedules.fire_due().fired == []  # nothing more until then
    assert len(fired_jobs(database_url, "grid")) == 1


def test_overlap_skip_waits_for_the_previous_job_and_queue_does_not(database_url, schedules):
    store = JobStore.for_url(database_url)
    schedules.add_periodic(PeriodicJob("slow", "p", "slow", Timing(every_seconds=60)))  # overlap skip
    schedules.add_periodic(PeriodicJob("eager", "p", "eager", Timing(every_seconds=60), overlap="queue"))
    for _ in range(2):
        make_due(database_url, "slow")
        make_due(database_url, "eager")
        schedules.fire_due()
    assert len(fired_jobs(database_url, "slow")) == 1 and len(fired_jobs(database_url, "eager")) == 2
    claimed = [job for job in store.claim_next_jobs(["p"], 10, node="n", worker="w").jobs
               if job.message["name"] == "slow"]
    make_due(database_url, "slow")
    assert schedules.fire_due().skipped == ["slow"]  # still running
    now = datetime.datetime.now()
    store.finish_job(project="p", spider="slow", job=claimed[0].job, start_time=now, end_time=now,
                     claimed=claimed[0], worker="w")
    make_due(database_url, "slow")
    assert [fired.name for fired in schedules.fire_due().fired] == ["slow"]  # done: fires again
    assert query(database_url, "SELECT name, fired, skipped FROM periodic_job ORDER BY name") == [
        ("eager", 2, 0), ("slow", 2, 2)
    ]


def test_paused_schedules_wait_and_resume_without_firing_missed_times(database_url, schedules):
    schedules.add_periodic(PeriodicJob("nap", "p", "s", Timing(every_seconds=10)))
    schedules.pause_periodic("nap")
    make_due(database_url, "nap", seconds_ago=35)
    firing = schedules.fire_due()
    assert firing.fired == [] and firing.next_due_in is None  # no active schedule: the firer sleeps its cap
    due = schedules.resume_periodic("nap")
    assert due > datetime.datetime.now(UTC) and schedules.fire_due().fired == []
    assert fired_jobs(database_url, "nap") == []


def test_a_broken_schedule_is_reported_and_does_not_hold_the_others(database_url, schedules):
    schedules.add_periodic(PeriodicJob("good", "p", "s", Timing(every_seconds=60)))
    schedules.add_periodic(PeriodicJob("bad", "p", "s", Timing(cron="0 3 * * *")))
    query(database_url, "UPDATE periodic_job SET cron = 'not a cron' WHERE name = 'bad'")  # by hand, unchecked
    make_due(database_url, "good")
    make_due(database_url, "bad")
    firing = schedules.fire_due()
    assert [fired.name for fired in firing.fired] == ["good"]
    assert [name for name, _ in firing.broken] == ["bad"] and firing.next_due_in > 50  # tried again later
    assert fired_jobs(database_url, "bad") == []


# --- three real nodes --------------------------------------------------------------------------------------------

PERIOD = 5
WINDOW = 60  # seconds of firings counted


def test_an_every_5_periodic_job_fires_once_per_period_across_three_nodes_one_killed(
    database, start_cluster, tmp_path
):
    url, admin_url = database
    cluster = start_cluster(url, 3, max_proc="2")
    command = ["periodic", "add", "tick", "--project", "example", "--spider", "sleeper", "--every", str(PERIOD),
               "-a", "tag=tick", "--database-url", admin_url]
    assert cli.main(command) == 0
    [(first_due,)] = query(admin_url, "SELECT CAST(extract(epoch FROM next_fire_time) AS float) FROM periodic_job")
    due_times = [first_due + PERIOD * k for k in range(WINDOW // PERIOD)]

    def ticks():
        return sorted((run for run in runs(tmp_path) if run["args"].get("tag") == "tick"), key=lambda r: r["started"])

    # Midway, SIGKILL a node that is not running the tick just started (its crawl would hold the next firing, with
    # overlap skip, until its lease expired): the node is one of the firers, and the others fire without it.
    wait_for(lambda: len(ticks()) >= len(due_times) // 2, WINDOW, "half the window's firings")
    busy = ticks()[-1]["node"]
    victim = next(node for node in cluster.nodes if node.name != busy)
    victim.kill()
    killed_at = time.time()
    wait_for(lambda: len(ticks()) >= len(due_times), WINDOW, "the window's firings")

    started = [run for run in ticks() if run["started"] < due_times[-1] + PERIOD]
    jobs = [run["job"] for run in started]
    print(f"{len(set(jobs))} firings in {len(due_times) * PERIOD}s; late by "
          f"{[round(run['started'] - due, 2) for run, due in zip(started, due_times)]}s; killed {victim.name}")
    assert len(set(jobs)) == len(jobs) == len(due_times)  # once per period, no firing twice, none run twice
    for run, due in zip(started, due_times):
        assert due <= run["started"] < due + PERIOD, (run, due)  # each in its own period
    after = [run for run in started if run["started"] > killed_at]
    assert after and victim.name not in {run["node"] for run in after}  # the survivors carried on
    [(fired, skipped)] = query(admin_url, "SELECT fired, skipped FROM periodic_job")
    assert skipped == 0 and fired >= len(due_times)
