"""The node's listener: at most ``listen_slots`` nodes LISTEN, the slots handed on, and an idle cluster woken at once.

Twenty real nodes polling every 5 s, 8 slots: what Postgres delivers a NOTIFY to (each node counts what it heard),
who holds the slots (``pg_locks``, as ``status`` shows them), and how long an idle cluster takes to start a crawl.
"""

import contextlib
import random
import time

from helpers import connect, query, run_json, runs_of, schedule, scrape, value, wait_for
from scrapyd_pgqueue.store import NOTIFY_CHANNEL

SLOTS = 8
POLL = 5.0


def holders(admin_url) -> dict[str, int]:
    """{node: slot} of the listen slots held now, as status shows them."""
    return {entry["node"]: entry["slot"] for entry in run_json(admin_url, "status")["listening"]}


def heard(node) -> float:
    return value(scrape(node), "scrapyd_pgqueue_notifications_heard_total", channel=NOTIFY_CHANNEL) or 0.0


def pickup_seconds(admin_url, job) -> float | None:
    """From the schedule to the crawl's start, both on the database's clock."""
    rows = query(admin_url, "SELECT extract(epoch FROM start_time - created_time) FROM spider_job WHERE job = %s "
                            "AND start_time IS NOT NULL", (job,))
    return float(rows[0][0]) if rows else None


def test_twenty_nodes_eight_listen_the_slots_pass_on_and_an_idle_cluster_starts_a_crawl_within_a_second(
    database, start_cluster, tmp_path
):
    url, admin_url = database
    nodes = start_cluster(url, 20, max_proc="1", poll_interval=str(POLL), listen_slots=str(SLOTS)).nodes
    by_name = {node.name: node for node in nodes}
    wait_for(lambda: len(holders(admin_url)) == SLOTS, 30, "the idle nodes to take every slot")

    # Postgres delivers a NOTIFY to the holders alone: the other twelve do not listen.
    listening = holders(admin_url)
    before = {node.name: heard(node) for node in nodes}
    with contextlib.closing(connect(admin_url)) as sender:
        sender.cursor().execute(f"NOTIFY {NOTIFY_CHANNEL}")
    wait_for(lambda: all(heard(by_name[name]) > before[name] for name in listening), 5, "the holders to hear it")
    time.sleep(1)  # the time the holders took, again, for a NOTIFY to reach any other node
    assert {name for node in nodes if heard(node) > before[(name := node.name)]} == set(listening)

    # An idle cluster starts a crawl at once, whichever node takes the schedule: a holder is woken and claims.
    for i in range(3):
        job = f"quick{i}"
        schedule(random.choice([node for node in nodes if node.name not in listening]), job, seconds="0")
        wait_for(lambda: runs_of(tmp_path, job), 30, f"{job} to run")
        pickup = pickup_seconds(admin_url, job)
        print(f"{job}: started {pickup:.3f} s after its schedule")
        assert pickup < 1.0, f"{job} waited for a poll"
        wait_for(lambda: len(holders(admin_url)) == SLOTS, POLL + 5, "the slots all held again")

    # A holder that gets busy gives its slot up, and an idle node takes it at its next poll.
    listening = holders(admin_url)  # the quick crawls handed some slots on
    schedule(nodes[0], "long", seconds="30")
    wait_for(lambda: runs_of(tmp_path, "long"), 30, "the long crawl to run")
    busy = runs_of(tmp_path, "long")[0]["node"]
    assert busy in listening  # the woken holder claimed it
    wait_for(lambda: busy not in holders(admin_url), 5, "the busy node to give its slot up")
    wait_for(lambda: len(holders(admin_url)) == SLOTS, POLL + 5, "an idle node to take the freed slot")

    # A holder SIGKILLed: the server frees its lock with its session, and an idle node takes the slot.
    killed = next(name for name in holders(admin_url) if name != busy)
    by_name[killed].kill()
    wait_for(lambda: killed not in holders(admin_url), 10, "the killed node's slot to be freed")
    wait_for(lambda: len(holders(admin_url)) == SLOTS, POLL + 5, "an idle node to take the killed node's slot")
    assert killed not in holders(admin_url) and busy not in holders(admin_url)
    assert sum(value(scrape(node), "scrapyd_pgqueue_node_listening", node=node.name, tags="")
               for node in nodes if node.name != killed) == SLOTS
