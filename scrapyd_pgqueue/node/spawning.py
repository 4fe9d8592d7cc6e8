"""The node's end of its spawner (``node/spawner.py``): how the node starts every crawl, ``scrapy list`` and warm process.

``start_spawner`` runs first in the node's application, before any connection or thread: it starts the spawner and,
when the node was started as root with ``crawl_users = on``, drops this process to ``node_user`` (the working
directory's owner, else the uid below ``crawl_uid_range``): from then on the node that parses requests holds no
privilege, and only the spawner can start a process under a project's uid. Where the node cannot switch users, the
spawner runs as the node's user, and the node says once that its projects share one trust domain.

``Spawner`` is the spawner's socket on the reactor (an IReadDescriptor): ``start`` sends a request with the child's
descriptors, ``RelayedProcess`` is the transport the child's protocol sees (its pid once forked, its pipes, its
exit), as Twisted's own process transport would be. A spawner that dies leaves the node unable to start anything:
the node stops, and its orchestrator starts it again.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass

from twisted.internet import defer, error, protocol
from twisted.logger import Logger

from scrapyd_pgqueue.node import relayed
from scrapyd_pgqueue.node import spawner as spawner_process
from scrapyd_pgqueue.node.crawl_keys import crawl_environment

log = Logger()

SEPARATE_USERS, ONE_USER, LANDLOCK = "separate users", "one user", "landlock"
READY_TIMEOUT = 30.0  # seconds the spawner may take to say it is ready
PYTHON = (sys.executable, *spawner_process.ISOLATED)  # how every child of the node runs Python
# The programs that start with the cancel signals held and release them behind their own handler
# (crawl_process/early_cancel.py); another runner an operator names gets them as Scrapyd's runner would.
HOLDING_CANCELS = ("scrapyd_pgqueue.runner", "scrapyd_pgqueue.crawl_process.warm_process")


@dataclass(frozen=True)
class Boundary:
    """What keeps one project's crawls from the node and from other projects: reported by daemonstatus.json."""

    separate_users: bool
    landlock: bool

    def names(self) -> list[str]:
        return [SEPARATE_USERS if self.separate_users else ONE_USER] + ([LANDLOCK] if self.landlock else [])


def node_account(name: str, uid_range: tuple[int, int]) -> tuple[int, int]:
    """The uid and gid a node started as root runs as: ``node_user`` (a name or a number), else the working
    directory's owner unless that is root, else the uid just below ``crawl_uid_range``."""
    if name:
        try:
            account = pwd.getpwnam(name)
            return account.pw_uid, account.pw_gid
        except KeyError:
            if not name.isdigit():
                raise ValueError(f"node_user {name!r} is neither an account nor a uid") from None
            return int(name), int(name)
    owner = os.stat(".")
    if owner.st_uid != 0:
        return owner.st_uid, owner.st_gid
    return uid_range[0] - 1, uid_range[0] - 1


# --- start-up, as root or as the node's user ------------------------------------------------------------------


_spawner: Spawner | None = None
_boundary = Boundary(separate_users=False, landlock=False)


def start_spawner(settings, directories: dict[str, str], secrets) -> Boundary:
    """Start the node's spawner and, when it may switch users, drop this process's privileges. Call once, before any
    connection, thread or port: what the node opens after this is the node user's."""
    global _spawner, _boundary, _crawl_users
    from scrapyd_pgqueue.crawl_process import landlock

    switch = settings.crawl_users and os.geteuid() == 0
    node_uid, node_gid = node_account(settings.node_user, settings.crawl_uid_range) if switch else (
        os.geteuid(), os.getegid())
    if switch:
        unreachable = spawner_process.unreachable_by_others(spawner_process.crawl_code_paths())
        if unreachable:
            from scrapyd_pgqueue.config import ConfigurationError

            raise ConfigurationError(
                "crawl_users = on runs each project's crawls under a uid of its own, which cannot reach "
                f"{', '.join(unreachable)}: install Python and the package where every user may read them (a "
                "virtualenv made from the system's python3 under /opt, say), or set crawl_users = off to run "
                "spider code as this node's user (root: one trust domain, and root's)")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    config = {"switch": switch, "node_gid": node_gid, "uids": list(settings.crawl_uid_range),
              "dirs": {kind: path for kind, path in directories.items() if kind in ("logs", "items", "jobs", "crawls")},
              "control": theirs.fileno()}
    process = subprocess.Popen([*PYTHON, "-m", spawner_process.__name__, json.dumps(config)],
                               pass_fds=(theirs.fileno(),), env=crawl_environment(os.environ, secrets))
    theirs.close()
    ours.settimeout(READY_TIMEOUT)
    try:
        ready = json.loads(ours.recv(65536) or b"{}")
    except (OSError, ValueError):
        ready = {}
    if "ready" not in ready:
        process.kill()
        raise RuntimeError("the node's spawner did not start (see the log above)")
    ours.settimeout(None)
    ours.setblocking(False)
    if switch:
        _make_node_directories(directories, node_uid, node_gid)
        os.setgroups([])
        os.setresgid(node_gid, node_gid, node_gid)
        os.setresuid(node_uid, node_uid, node_uid)
    _spawner = Spawner(ours, process)
    _crawl_users = CrawlUsers(settings)
    _boundary = Boundary(separate_users=switch, landlock=settings.crawl_landlock and landlock.abi_version() > 0)
    if not switch:
        log.warn("This node cannot switch users ({why}): every project's crawls run as its own user, so its projects "
                 "share one trust domain (each crawl is still isolated: its own directory{landlock}, no keys, its own "
                 "token). Start the node as root for a user per project.",
                 why="crawl_users = off" if not settings.crawl_users else "not started as root",
                 landlock=", Landlock" if _boundary.landlock else "")
    return _boundary


def node_directories(config, settings, environment) -> dict[str, str]:
    """The node's directories by kind, absolute: the crawls' (logs, items, jobs, crawls), made by the spawner, and
    the node's own (eggs, dbs, crawl_api)."""
    from scrapyd_pgqueue.node.crawl_api import SOCKET_DIRECTORY

    directories = {"logs": environment.logs_dir, "items": environment.items_dir if os.path.isabs(
        environment.items_dir or "x") else "", "jobs": environment.jobs_dir, "crawls": settings.crawls_dir,
                   "eggs": config.get("eggs_dir", "eggs"), "dbs": config.get("dbs_dir", "dbs"),
                   "crawl_api": SOCKET_DIRECTORY}
    return {kind: os.path.abspath(path) for kind, path in directories.items() if path}


def _make_node_directories(directories: dict[str, str], uid: int, gid: int) -> None:
    """The node's own directories (its egg cache, its dbs, its crawl endpoint's socket) become the node user's; its
    working directory is no one else's to write (a Kubernetes emptyDir is world-writable)."""
    working = os.stat(".")
    if working.st_mode & 0o022:
        os.chmod(".", working.st_mode & 0o7755)
    for kind in ("eggs", "dbs", "crawl_api"):
        path = directories.get(kind)
        if path:
            os.makedirs(path, mode=0o700, exist_ok=True)
            os.chown(path, uid, gid, follow_symlinks=False)


class CrawlUsers:
    """Each project's uid, from the database once per project and node (threads); None while crawls run as the
    node's user."""

    def __init__(self, settings):
        self.settings = settings
        self.uids: dict[str, int] = {}

    def uid(self, project: str) -> int | None:
        if not _boundary.separate_users:
            return None
        if project not in self.uids:
            from scrapyd_pgqueue.store import EggStore

            self.uids[project] = EggStore.for_settings(self.settings).project_uid(project, *self.settings.crawl_uid_range)
        return self.uids[project]


_crawl_users: CrawlUsers | None = None


def crawl_uid(project: str) -> int | None:
    """Thread: the uid ``project``'s crawls run as (None: the node's own)."""
    return None if _crawl_users is None else _crawl_users.uid(project)


def launch_file(launch: dict) -> int:
    """A launch (``crawl_process/launch.py``) as a sealed memory file: the caller's descriptor, to send and close."""
    import fcntl

    fd = os.memfd_create("launch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, json.dumps(launch).encode())
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    return fd


def node_spawner() -> Spawner:
    if _spawner is None:
        raise RuntimeError("the node's spawner was not started: name scrapyd_pgqueue.application in [scrapyd]")
    return _spawner


def boundary() -> Boundary:
    return _boundary


# --- on the reactor -------------------------------------------------------------------------------------------


class Spawner:
    """The spawner's socket on the reactor: start requests out, pids and exits in."""

    def __init__(self, sock: socket.socket, process: subprocess.Popen):
        self.socket, self.process = sock, process
        self.children: dict[int, relayed.RelayedProcess] = {}
        self.numbers = iter(range(1, sys.maxsize))
        self.reading = False
        self.stopping = False  # the reactor is stopping: it disconnects every reader, this one included

    def start(self, child: relayed.RelayedProcess, argv: list[str], env: dict, project: str, uid: int | None,
              scratch: str | None, fds: dict[int, int]) -> None:
        """Ask for a child; its transport ``child`` learns its pid and exit. The descriptors in ``fds`` (target ->
        ours) are sent, not closed. OSError when the spawner is gone or the request is too big."""
        from twisted.internet import reactor

        if not self.reading:
            reactor.addReader(self)
            reactor.addSystemEventTrigger("before", "shutdown", setattr, self, "stopping", True)
            self.reading = True
        number = next(self.numbers)
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None
        message = json.dumps({"start": number, "argv": argv, "env": env, "project": project, "uid": uid,
                              "scratch": scratch, "fds": list(fds),
                              "hold_cancels": module in HOLDING_CANCELS}).encode()
        if len(message) > spawner_process.MAX_MESSAGE:
            raise OSError("the crawl's environment is too big to start it")
        socket.send_fds(self.socket, [message], list(fds.values()))
        child.number = number
        child.signaller = lambda signal_number: self.signal(number, signal_number)
        self.children[number] = child

    def signal(self, number: int, signal_number: int) -> None:
        self.socket.send(json.dumps({"signal": number, "number": signal_number}).encode())

    def fileno(self) -> int:
        return self.socket.fileno()

    def logPrefix(self) -> str:
        return "Spawner"

    def doRead(self):
        return relayed.read_messages(self.socket, self.received)

    def received(self, message: dict) -> None:
        child = self.children.get(message["start"])
        if child is None:
            return
        if "pid" in message:
            child.started(message["pid"])
        elif "error" in message:
            del self.children[message["start"]]
            child.could_not_start(message["error"])
        else:
            del self.children[message["start"]]
            child.exited(message["status"])

    def connectionLost(self, reason) -> None:
        from twisted.internet import reactor

        if self.stopping:
            return  # its children are the stopping launcher's business; the spawner leaves when this process does
        log.critical("The node's spawner exited: this node cannot start crawls any more, it stops")
        self.socket.close()
        for child in self.children.values():
            child.parent_died()
        self.children.clear()
        reactor.callLater(0, reactor.stop)


def run_to_end(argv, env, project, uid, fds) -> defer.Deferred:
    """Reactor thread: start a child whose stdout and stderr the node collects; fires with (status, stdout,
    stderr) once it has ended (``scrapy list``)."""

    class Collect(protocol.ProcessProtocol):
        def __init__(self):
            self.out, self.err, self.done = [], [], defer.Deferred()
            self.project = project

        def childDataReceived(self, name, data):
            (self.out if name == 1 else self.err).append(data)

        def processEnded(self, reason):
            code = 0
            if isinstance(reason.value, error.ProcessTerminated):
                code = reason.value.exitCode if reason.value.exitCode is not None else 128 + reason.value.signal
            self.done.callback((code, b"".join(self.out), b"".join(self.err)))

    collect = Collect()
    ours, theirs = relayed.pipes((1, 2))
    child = relayed.RelayedProcess(collect, ours)
    try:
        node_spawner().start(child, argv, env, project, uid, uuid.uuid4().hex, {**theirs, **fds})
    except OSError:
        child.close_pipes()
        raise
    finally:
        relayed.close_all(theirs.values())
    return collect.done
