"""What a crawl is told at its start, and what it makes of itself before any spider code loads.

Nothing secret or personal is on a crawl's command line or in its environment: ``/proc/<pid>/cmdline`` is readable by
every user, and ``environ`` by every process of its user once it has exec'd a child (Scrapy's start-up runs
``uname -p``). The node writes the launch as JSON into a sealed memory file, descriptor ``LAUNCH_FD``:
``args`` (the crawl's arguments, settings and spider arguments included), ``node`` and ``token`` (its way to its
node's crawl endpoint), ``directories`` (its log and items directories, which it makes itself, under its own uid),
and ``readable``/``writable`` (the paths Landlock leaves it, when ``landlock`` is true). The egg comes the same
way: a sealed memory file on ``EGG_FD`` holding the very bytes the node checked against the egg's sha256, imported
by its ``/proc/self/fd`` path, so no file can be swapped between the check and the import.

Runs in the crawl process before Scrapy installs its reactor: the standard library and ``crawl_process`` only.
"""

from __future__ import annotations

import configparser
import json
import os
import sys
import zipfile

from scrapyd_pgqueue.crawl_process import crawl_node, landlock

LAUNCH_FD = 4  # the launch channel, a sealed memory file
EGG_FD = 5  # the egg, a sealed memory file
LAUNCH_VARIABLE = "SCRAPYD_PGQUEUE_LAUNCH"  # set (to LAUNCH_FD) when the node gave one: a runner run by hand has none
EGG_PATH = f"/proc/self/fd/{EGG_FD}"  # what the egg storage opens (SCRAPYD_PGQUEUE_EGG)
ARGS, NODE, TOKEN, DIRECTORIES, LANDLOCK, READABLE, WRITABLE = (
    "args", "node", "token", "directories", "landlock", "readable", "writable")
# Scrapy's own servers a crawl would open on loopback to whoever finds their port and token: off, whatever the
# project's settings say (command-line settings win over a project's and a spider's).
CLOSED_SERVERS = ["-s", "TELNETCONSOLE_ENABLED=0", "-s", "REMOTE_CONTROL_ENABLED=0"]


def read_launch() -> dict:
    """The launch the node gave this process ({} when none), read once; its descriptor closed."""
    if os.environ.pop(LAUNCH_VARIABLE, None) is None:
        return {}
    with os.fdopen(LAUNCH_FD, "rb") as channel:
        channel.seek(0)
        return json.loads(channel.read())


def enter(launch: dict) -> None:
    """Become the crawl the launch describes: its arguments, its node, its directories, its Landlock domain."""
    if ARGS in launch:
        sys.argv[2:] = [*(CLOSED_SERVERS if sys.argv[1:2] == ["crawl"] else []), *launch[ARGS]]
    crawl_node.set_node(launch.get(NODE), launch.get(TOKEN))
    for directory in launch.get(DIRECTORIES, ()):
        make_shared_directory(directory)
    if os.path.exists(EGG_PATH):
        os.set_inheritable(EGG_FD, False)  # the crawl's own children have no use for it
    if launch.get(LANDLOCK):  # its own directory (its working directory) is writable too
        landlock.restrict([*landlock.crawl_readable_paths(), *launch.get(READABLE, ())],
                          [os.getcwd(), *launch.get(WRITABLE, ())])


def enter_scratch(path: str) -> None:
    """A forked crawl's own directory (a cold one gets it from the spawner): its cwd, HOME and TMPDIR."""
    os.mkdir(path, 0o700)
    os.chdir(path)
    os.environ.update(HOME=path, TMPDIR=path)


def make_shared_directory(path: str) -> None:
    """A log or items directory of this crawl's project: its node's group reads and prunes it. The project's
    directory is setgid to that group, so new directories inherit the group and the setgid bit (a chmod by the crawl,
    not of that group, would clear it): made with the group's rights, never changed after."""
    umask = os.umask(0o007)
    try:
        os.makedirs(path, mode=0o770, exist_ok=True)
    finally:
        os.umask(umask)


def activate_egg(path: str) -> None:
    """Scrapyd's ``activate_egg`` without ``pkg_resources``, which reads an egg's name from its file name: the egg
    on ``sys.path`` (zipimport reads it by its ``/proc/self/fd`` path), its settings module from its entry points."""
    with zipfile.ZipFile(path) as egg:
        entry_points = configparser.ConfigParser()
        entry_points.read_string(egg.read("EGG-INFO/entry_points.txt").decode())
    sys.path.insert(0, path)
    os.environ.setdefault("SCRAPY_SETTINGS_MODULE", entry_points["scrapy"]["settings"])
