# From scrapyd 1.6.0 (sdist, tests/__init__.py), Copyright (c) Scrapy developers, BSD license (see LICENSE here).
# Unmodified except where a line is marked "scrapyd_pgqueue:" (the fixtures are read from this directory).
import datetime
import io
import os.path
import pkgutil

from scrapyd.launcher import ScrapyProcessProtocol
from twisted.logger import eventAsText


def touch(path):
    path.parent.mkdir(parents=True)
    path.touch()


def get_egg_data(basename):
    return pkgutil.get_data(__name__, f"fixtures/{basename}.egg")  # scrapyd_pgqueue: this package, not "tests"


def has_settings():
    return os.path.exists("scrapy.cfg")


def root_add_version(root, project, version, basename):
    root.eggstorage.put(io.BytesIO(get_egg_data(basename)), project, version)


def get_message(captured):
    return eventAsText(captured[0]).split(" ", 1)[1]


def get_finished_job(project="p1", spider="s1", job="j1", start_time=None, end_time=None):
    if start_time is None:
        start_time = datetime.datetime.now()
    if end_time is None:
        end_time = datetime.datetime.now()
    process = ScrapyProcessProtocol(project, spider, job, env={}, args=[])
    process.start_time = start_time
    process.end_time = end_time
    return process
