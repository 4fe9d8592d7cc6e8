"""Shared test helpers: waiting on real processes, looking at the database, the crawls' own records."""

from __future__ import annotations

import contextlib
import json
import time
import uuid

import psycopg2
from sqlalchemy import make_url

SECRET = "fault-s3cret-pw"  # the nodes' database password in fault tests: no log line may show it


def wait_for(condition, timeout: float, what: str, interval: float = 0.1):
    """Call ``condition`` until it returns something truthy, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# --- database ---------------------------------------------------------------------------------------------------


def connect(url, **kwargs):
    parsed = make_url(url)
    connection = psycopg2.connect(
        host=parsed.host, port=parsed.port or 5432, user=parsed.username, password=parsed.password,
        dbname=parsed.database or "postgres", connect_timeout=5, **kwargs,
    )
    connection.autocommit = True
    return connection


def query(url, sql, params=()):
    """Run one statement on a connection of its own (the server restarts under these tests)."""
    with contextlib.closing(connect(url)) as connection, connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else None


def database_with_secret_owner(server_url: str) -> tuple[str, str]:
    """A new database owned by a new role with a password: (the nodes' URL, a superuser URL to the same database)."""
    name = f"fault_{uuid.uuid4().hex[:10]}"
    with contextlib.closing(connect(server_url)) as admin, admin.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {name} LOGIN PASSWORD %s", (SECRET,))
        cursor.execute(f"CREATE DATABASE {name} OWNER {name}")
    superuser_url = make_url(server_url).set(database=name)
    nodes_url = superuser_url.set(username=name, password=SECRET)
    return nodes_url.render_as_string(hide_password=False), superuser_url.render_as_string(hide_password=False)


def accepting(server_url):
    try:
        connect(server_url).close()
        return True
    except psycopg2.OperationalError:
        return False


# --- crawls -----------------------------------------------------------------------------------------------------


def runs(tmp_path) -> list[dict]:
    path = tmp_path / "records" / "runs.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def runs_of(tmp_path, job) -> list[dict]:
    return [run for run in runs(tmp_path) if run["job"] == job]


def ends(tmp_path) -> list[dict]:
    """The crawls that closed, one record each (``ended``: when the spider closed), as ``runs`` has their starts."""
    path = tmp_path / "records" / "ends.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def jobs(url, *names):
    """{job id: (status, outcome, node, attempts)}, every row of the given job ids (all jobs when none given)."""
    rows = query(
        url,
        "SELECT job, status, outcome, node, attempts FROM spider_job WHERE %s OR job = ANY(%s) ORDER BY id",
        (not names, list(names)),
    )
    table = {}
    for job, *state in rows:
        assert job not in table, f"job {job} has two rows"
        table[job] = tuple(state)
    return table


def schedule(node, job, spider="sleeper", **args):
    answer = node.post("schedule.json", project="example", spider=spider, jobid=job, **args)
    assert answer["status"] == "ok", answer
    return answer


def timed(node, method, endpoint, timeout: float = 30, **params):
    """(seconds, answer) of one request; an HTTP error or no answer within ``timeout`` seconds fails the test."""
    started = time.monotonic()
    answer = getattr(node, method)(endpoint, timeout=timeout, **params)
    return time.monotonic() - started, answer


# --- browser ----------------------------------------------------------------------------------------------------

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def chromium(width: int = 1280, height: int = 1400):
    """A headless Chromium driven by Selenium: Debian's browser and driver, so nothing is downloaded."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def screenshot(driver, directory, name: str):
    """Save the page as directory/name.png and print where (a test artifact for people to look at)."""
    path = directory / f"{name}.png"
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def table_rows(driver, table_id: str) -> list[list[str]]:
    """The text of every cell of every row of the table with this id (header rows have no <td>)."""
    from selenium.webdriver.common.by import By

    rows = driver.find_element(By.ID, table_id).find_elements(By.TAG_NAME, "tr")
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")] for row in rows]
