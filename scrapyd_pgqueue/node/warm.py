"""Warm starts (``warm_start = on``): crawls forked from a warm process per project version, on the reactor thread.

A warm process (``scrapyd_pgqueue/crawl_process/warm_process.py``) has imported one project version once; each crawl is a fork
of it, so it reaches its spider in tens of milliseconds instead of a quarter of a second of imports. To the
launcher a forked crawl looks like a spawned one: the node makes its stdout, stderr and stats pipes and reads them as
Twisted reads a child's, ``WarmCrawl`` is its transport (the real pid, signals sent through its warm process), and
``processEnded`` gets the ``ProcessDone`` or ``ProcessTerminated`` that Twisted would give. The warm process itself
is started by the node's spawner (``node/spawner.py``), under the project's uid. Never worse than cold: a crawl whose
warm process is still importing its project, a project that cannot be forked safely, a warm process that dies
before forking, a message too big to send all mean a cold spawn; a crawl whose warm process died under it ends with
``warm_parent_died`` set, and the launcher hands its job back. A warm process is keyed by its project and its egg's sha256 (a
redeployed version is a new key; the egg is the sealed memory file its crawls get too), runs as its crawls' user,
retired when its project changes in the egg catalogue, when
it is the least recently used of too many, or idle.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from collections import OrderedDict

from twisted.internet import error, protocol, reactor
from twisted.logger import Logger
from twisted.python.failure import Failure

from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.crawl_process import launch, warm_process
from scrapyd_pgqueue.crawl_process.crawl_node import PROJECT_VARIABLE
from scrapyd_pgqueue.crawl_process.job_stats import STATS_FD
from scrapyd_pgqueue.node import relayed, spawning
from scrapyd_pgqueue.node.crawl_keys import crawl_environment

log = Logger()

# Seconds a warm process may take to import its project: past it, it is killed and the project spawned cold.
READY_TIMEOUT = 120.0


class WarmCrawl(relayed.RelayedProcess):
    """The transport of one forked crawl: its pipes, its pid once forked, signals through its warm process."""

    forked = True


class WarmOutput(protocol.ProcessProtocol):
    """The warm process's own output (an import's warning, a crash) in the node's log."""

    def __init__(self, project: str):
        self.project = project

    def outReceived(self, data):
        log.info("{output}", output=data.decode(errors="replace").rstrip(), log_system=f"Warm,{self.project}")

    def errReceived(self, data):
        log.warn("{output}", output=data.decode(errors="replace").rstrip(), log_system=f"Warm,{self.project}")


class WarmProcess:
    """The node's end of one warm process (an IReadDescriptor on its socket)."""

    def __init__(self, pool, key: tuple[str, str], process, egg):
        """A warm process of the project and egg (``key``: its name and the egg's digest) that ``process``, a crawl
        about to start, runs, under that crawl's uid."""
        self.pool, self.key = pool, key
        self.crawls: dict[int, WarmCrawl] = {}  # by the number of the request that asked for it
        self.numbers = iter(range(1, sys.maxsize))
        self.last_used = time.monotonic()
        self.spawned_at = time.monotonic()
        self.alive = True
        self.ready = False
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        project = key[0]
        # Without the node's secrets: every crawl forked from it holds this process's first environment in memory.
        env = {**crawl_environment(os.environ, pool.secrets), PROJECT_VARIABLE: project,
               EGG_FILE_VARIABLE: launch.EGG_PATH if egg is not None else "",
               launch.LAUNCH_VARIABLE: str(launch.LAUNCH_FD)}
        env.update({name: process.env[name] for name in ("SCRAPY_SETTINGS_MODULE",) if name in process.env})
        # It may write what any crawl of its project writes: its forks make their own directories there.
        writable = [*pool.project_directories(project), os.path.join(pool.crawls_dir, project),
                    *pool.settings.crawl_paths, os.devnull]
        launch_fd = spawning.launch_file({launch.LANDLOCK: spawning.boundary().landlock, launch.WRITABLE: writable})
        ours, out = relayed.pipes((1, 2))
        self.process = relayed.RelayedProcess(WarmOutput(project), ours)
        control = warm_process.CONTROL_FD
        try:
            spawning.node_spawner().start(
                self.process, [*spawning.PYTHON, "-m", warm_process.__name__, str(control)], env, project,
                process.uid, uuid.uuid4().hex,
                {**out, control: theirs.fileno(), launch.LAUNCH_FD: launch_fd,
                 **({launch.EGG_FD: egg.fd} if egg is not None else {})})
        except OSError:
            self.process.close_pipes()
            raise
        finally:
            theirs.close()
            relayed.close_all([*out.values(), launch_fd])
        self.uid = process.uid
        # For its crawls that go cold if it dies before forking them.
        self.egg = None if egg is None else egg._replace(fd=os.dup(egg.fd))  # a SealedEgg of its own
        self.socket.setblocking(False)
        reactor.addReader(self)
        self.ready_timer = reactor.callLater(READY_TIMEOUT, self._not_ready)

    def _not_ready(self) -> None:
        """An import that hangs would hold its crawls forever: they go cold, as every later crawl of it."""
        self.pool.spawn_cold_from_now_on(self.key, f"its import took more than {READY_TIMEOUT:g}s")
        try:
            self.process.signalProcess("KILL")  # its socket closes: connectionLost spawns its crawls cold
        except error.ProcessExitedAlready:
            pass

    def fork(self, process) -> bool:
        """Ask for a fork running ``process`` (its launch and env); False when it cannot be asked (spawn cold)."""
        number = next(self.numbers)
        # Its warm process's Landlock domain (its project's directories) holds for it: a ruleset of its own would
        # cost each fork about 10 ms of its start.
        crawl_launch = {**process.launch, launch.LANDLOCK: False}
        message = json.dumps({warm_process.CRAWL: number, warm_process.ARGS: process.args[-1:],
                              warm_process.ENV: process.env, warm_process.LAUNCH: crawl_launch,
                              warm_process.SCRATCH: os.path.join(self.pool.crawls_dir, self.key[0],
                                                                 uuid.uuid4().hex)}).encode()
        if not self.alive or len(message) > warm_process.MAX_MESSAGE or process.uid != self.uid:
            return False
        ours, theirs = relayed.pipes((1, 2, STATS_FD))
        try:
            socket.send_fds(self.socket, [message], list(theirs.values()))  # warm_process.CRAWL_FDS, in order
        except OSError:  # full (a warm process still importing with many crawls queued), or gone
            relayed.close_all(ours.values())
            return False
        finally:
            relayed.close_all(theirs.values())
        crawl = self.crawls[number] = WarmCrawl(process, ours)
        crawl.signaller = lambda signal_number: self.signal(number, signal_number)
        self.last_used = time.monotonic()
        return True

    def signal(self, number: int, signal_number: int) -> None:
        """Its warm process signals a crawl (the node may run as another user than the crawl)."""
        self.socket.send(json.dumps({warm_process.SIGNAL: number, warm_process.NUMBER: signal_number}).encode())

    def retire(self) -> None:
        """No more crawls: the warm process exits once its running crawls have ended."""
        if self.alive:
            self.alive = False
            try:
                self.socket.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    # --- IReadDescriptor --------------------------------------------------------------------------------------

    def fileno(self) -> int:
        return self.socket.fileno()

    def logPrefix(self) -> str:
        return f"Warm,{self.key[0]}"

    def doRead(self):
        return relayed.read_messages(self.socket, self.received)

    def received(self, message: dict) -> None:
        if warm_process.READY in message:
            self.ready = True
            self.ready_timer.cancel()
            log.info("Warm process {pid} of project {project} ready in {seconds:.2f}s",
                     pid=message[warm_process.READY], project=self.key[0],
                     seconds=time.monotonic() - self.spawned_at)
        elif warm_process.COLD in message:
            self.pool.spawn_cold_from_now_on(self.key, message[warm_process.COLD])
        elif warm_process.PID in message:
            self.crawls[message[warm_process.CRAWL]].started(message[warm_process.PID])
        else:
            self.last_used = time.monotonic()  # idle from the end of its last crawl
            self.crawls.pop(message[warm_process.CRAWL]).exited(message[warm_process.STATUS])

    def connectionLost(self, reason) -> None:
        """The warm process exited (retired, cold, or killed): what it had not forked yet is spawned cold."""
        self.alive = False
        self.socket.close()
        self.pool.forget(self)
        if self.ready_timer.active():
            self.ready_timer.cancel()
        if not self.ready:
            if self.key not in self.pool.cold_reasons:  # a crash while importing would crash every time
                self.pool.spawn_cold_from_now_on(self.key, "its warm process exited while importing the project")
        elif self.crawls:
            log.error("Warm process of project {project} died with {count} crawls", project=self.key[0],
                      count=len(self.crawls))
        for crawl in self.crawls.values():
            if crawl.pid is None:
                crawl.close_pipes()
                self.pool.spawn_cold(crawl.process, self.egg, crawl.pending_signals)
            else:
                crawl.parent_died()
        self.crawls.clear()
        if self.egg is not None:
            os.close(self.egg.fd)


class WarmStarts:
    """The node's warm processes: at most ``warm_processes``, least recently used retired first."""

    def __init__(self, settings, spawn_cold, secrets=frozenset()):
        self.settings = settings
        self.max_processes, self.idle_seconds = settings.warm_processes, settings.warm_idle_timeout
        self.crawls_dir = os.path.abspath(settings.crawls_dir)
        self.secrets = secrets  # the node's secret values, kept out of its warm processes' environments
        self._spawn_cold = spawn_cold  # launcher: spawn a protocol with its egg, as Scrapyd would, cold
        self.warm: OrderedDict[tuple[str, str], WarmProcess] = OrderedDict()
        self.cold_reasons: dict[tuple[str, str], str] = {}  # project versions that are always spawned cold
        self.project_directories = lambda project: []  # the launcher's environment's, set by the launcher

    def spawn(self, process, egg, ours: bool = True) -> None:
        """Start ``process`` (a launcher's protocol with its launch and env) warm if possible, else cold. ``egg``:
        its ``SealedEgg``, None for a project baked in; ``ours``: whether the eggs are ours (another egg storage
        gives no egg to fork from)."""
        if not ours:
            return self._spawn_cold(process, egg)
        key = (process.project, egg.digest if egg is not None else "")
        if key in self.cold_reasons:
            return self._spawn_cold(process, egg)
        warm = self.warm.get(key)
        if warm is None or not warm.alive:
            while len(self.warm) >= self.max_processes:
                self.warm.popitem(last=False)[1].retire()
            try:
                warm = self.warm[key] = WarmProcess(self, key, process, egg)
            except Exception as e:  # noqa: BLE001 - e.g. out of file descriptors: this crawl goes cold
                log.error("Could not start a warm process of project {project}: {error}", project=process.project,
                          error=e)
                return self._spawn_cold(process, egg)
        self.warm.move_to_end(key)
        if not warm.ready or not warm.fork(process):  # importing still: a cold spawn starts now, never later
            self._spawn_cold(process, egg)

    def spawn_cold(self, process, egg, signals=()) -> None:
        """A crawl its warm process never forked: cold, with the signals it was sent meanwhile."""
        try:
            self._spawn_cold(process, egg)
        except Exception as e:  # noqa: BLE001 - ends as a crawl that could not start would
            log.error("Could not start job {job}: {error}", job=process.job, error=e)
            process.processEnded(Failure(error.ProcessTerminated(1)))
            return
        for number in signals:
            process.transport.signalProcess(number)

    def spawn_cold_from_now_on(self, key, reason: str) -> None:
        self.cold_reasons[key] = reason
        log.warn("Project {project} is spawned cold: {reason}", project=key[0], reason=reason)

    def forget(self, warm: WarmProcess) -> None:
        if self.warm.get(warm.key) is warm:
            del self.warm[warm.key]

    def retire_projects(self, projects, started_before: float) -> None:
        """Their eggs changed: no crawl may fork from code imported before (by the warm processes started before
        ``started_before``, ``time.monotonic()``, when the change was known to be committed)."""
        projects = set(projects)
        stale = [key for key, warm in self.warm.items() if key[0] in projects and warm.spawned_at < started_before]
        for key in stale:
            self.warm.pop(key).retire()
        for key in [key for key in self.cold_reasons if key[0] in projects]:
            del self.cold_reasons[key]

    def retire_idle(self) -> None:
        now = time.monotonic()
        for key in [key for key, warm in self.warm.items()
                    if not warm.crawls and now - warm.last_used > self.idle_seconds]:
            self.warm.pop(key).retire()

    def stop(self) -> None:
        while self.warm:
            self.warm.popitem()[1].retire()
