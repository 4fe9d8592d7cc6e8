"""Warm starts (``warm_start = on``): crawls forked from a warm process per project version, on the reactor thread.

A warm process (``scrapyd_pgqueue/crawl_process/warm_process.py``) has imported one project version once; each crawl is a fork
of it, so it reaches its spider in tens of milliseconds instead of a quarter of a second of imports. To the
launcher a forked crawl looks like a spawned one: the node makes its stdout, stderr and stats pipes and reads them as
Twisted reads a child's, ``WarmCrawl`` is its transport (the real pid, ``signalProcess``), and ``processEnded``
gets the ``ProcessDone`` or ``ProcessTerminated`` that Twisted would give. Never worse than cold: a crawl whose
warm process is still importing its project, a project that cannot be forked safely, a warm process that dies
before forking, a message too big to send all mean a cold spawn; a crawl whose warm process died under it ends with
``warm_parent_died`` set, and the launcher hands its job back. A warm process is keyed by its project and egg file
(the egg's row id: a redeployed version is a new key), retired when its project changes in the egg catalogue, when
it is the least recently used of too many, or idle.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections import OrderedDict

from twisted.internet import error, main, protocol, reactor
from twisted.internet.process import ProcessReader
from twisted.logger import Logger
from twisted.python.failure import Failure

from scrapyd_pgqueue.crawl_process import warm_process
from scrapyd_pgqueue.config import EGG_FILE_VARIABLE
from scrapyd_pgqueue.crawl_process.crawl_node import PROJECT_VARIABLE
from scrapyd_pgqueue.crawl_process.job_stats import STATS_FD
from scrapyd_pgqueue.node.crawl_keys import crawl_environment

log = Logger()

# Seconds a warm process may take to import its project: past it, it is killed and the project spawned cold.
READY_TIMEOUT = 120.0


class WarmCrawl:
    """The transport of one forked crawl: its output pipes, its pid once forked, its end."""

    def __init__(self, process, out_fd: int, err_fd: int, stats_fd: int):
        self.process = process
        self.pid = None
        self.status = None  # waitpid's status, once known
        self.ended = False
        self.pending_signals: list[int] = []  # signalled before the fork was reported: sent right after
        self.readers = {1: ProcessReader(reactor, self, 1, out_fd), 2: ProcessReader(reactor, self, 2, err_fd),
                        STATS_FD: ProcessReader(reactor, self, STATS_FD, stats_fd)}
        process.transport = self  # cancel.json may signal it before its pid is known

    def started(self, pid: int) -> None:
        self.pid = pid
        self.process.makeConnection(self)  # connectionMade: the protocol reads the pid and logs the start
        for number in self.pending_signals:
            self.signalProcess(number)

    def signalProcess(self, signal_id) -> None:
        if self.status is not None:
            raise error.ProcessExitedAlready()
        number = getattr(signal, f"SIG{signal_id}") if isinstance(signal_id, str) else signal_id
        if self.pid is None:
            self.pending_signals.append(number)
            return
        try:
            os.kill(self.pid, number)
        except ProcessLookupError:
            raise error.ProcessExitedAlready() from None

    def childDataReceived(self, name, data) -> None:
        self.process.childDataReceived(name, data)

    def childConnectionLost(self, name, reason) -> None:
        os.close(self.readers.pop(name).fd)
        self.process.childConnectionLost(name)
        self._maybe_ended()

    def close_pipes(self) -> None:
        """Not forked after all: stop reading (the cold spawn makes its own pipes)."""
        for reader in self.readers.values():
            reader.stopReading()
            os.close(reader.fd)
        self.readers.clear()

    def exited(self, status: int) -> None:
        self.status = status
        self._maybe_ended()

    def parent_died(self) -> None:
        """Its warm process died: the crawl was SIGKILLed with it (PR_SET_PDEATHSIG)."""
        self.process.warm_parent_died = True
        self.exited(signal.SIGKILL)

    def _maybe_ended(self) -> None:
        """As Twisted: processEnded once the crawl has exited and both pipes are closed (all output read)."""
        if self.ended or self.readers or self.status is None:
            return
        self.ended = True
        code = os.WEXITSTATUS(self.status) if os.WIFEXITED(self.status) else None
        number = None if os.WIFEXITED(self.status) else os.WTERMSIG(self.status)
        reason = error.ProcessTerminated(code, number, self.status) if code or number else error.ProcessDone(
            self.status)
        self.process.processEnded(Failure(reason))


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

    def __init__(self, pool, key: tuple[str, str]):
        self.pool, self.key = pool, key
        self.crawls: dict[int, WarmCrawl] = {}  # by the number of the request that asked for it
        self.numbers = iter(range(1, sys.maxsize))
        self.last_used = time.monotonic()
        self.spawned_at = time.monotonic()
        self.alive = True
        self.ready = False
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        project, egg = key
        # Without the node's secrets: every crawl forked from it holds this process's first environment in memory.
        env = {**crawl_environment(os.environ, pool.secrets), PROJECT_VARIABLE: project,
               EGG_FILE_VARIABLE: egg, warm_process.NODE_PID_VARIABLE: str(os.getpid())}
        control = warm_process.CONTROL_FD
        args = [sys.executable, "-m", warm_process.__name__, str(control)]
        try:
            self.process = reactor.spawnProcess(WarmOutput(project), sys.executable, args=args, env=env,
                                                childFDs={0: "w", 1: "r", 2: "r", control: theirs.fileno()})
        finally:
            theirs.close()
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
        """Ask for a fork running ``process`` (its args and env); False when it cannot be asked (spawn cold)."""
        number = next(self.numbers)
        message = json.dumps({warm_process.CRAWL: number, warm_process.ARGS: process.args,
                              warm_process.ENV: process.env}).encode()
        if not self.alive or len(message) > warm_process.MAX_MESSAGE:
            return False
        (out_read, out_write), (err_read, err_write), (stats_read, stats_write) = os.pipe(), os.pipe(), os.pipe()
        try:
            socket.send_fds(self.socket, [message], [out_write, err_write, stats_write])  # warm_process.CRAWL_FDS
        except OSError:  # full (a warm process still importing with many crawls queued), or gone
            for fd in (out_read, err_read, stats_read):
                os.close(fd)
            return False
        finally:
            for fd in (out_write, err_write, stats_write):
                os.close(fd)
        self.crawls[number] = WarmCrawl(process, out_read, err_read, stats_read)
        self.last_used = time.monotonic()
        return True

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
        while True:
            try:
                data = self.socket.recv(65536)
            except BlockingIOError:
                return None
            except OSError:
                return main.CONNECTION_LOST
            if not data:
                return main.CONNECTION_DONE
            self.received(json.loads(data))

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
                self.pool.spawn_cold(crawl.process, crawl.pending_signals)
            else:
                crawl.parent_died()
        self.crawls.clear()


class WarmStarts:
    """The node's warm processes: at most ``max_processes``, least recently used retired first."""

    def __init__(self, max_processes: int, idle_seconds: float, spawn_cold, secrets=frozenset()):
        self.max_processes, self.idle_seconds = max_processes, idle_seconds
        self.secrets = secrets  # the node's secret values, kept out of its warm processes' environments
        self._spawn_cold = spawn_cold  # launcher: spawn a protocol as Scrapyd does
        self.warm: OrderedDict[tuple[str, str], WarmProcess] = OrderedDict()
        self.cold_reasons: dict[tuple[str, str], str] = {}  # project versions that are always spawned cold

    def spawn(self, process, project: str, egg: str | None) -> None:
        """Start ``process`` (a launcher's protocol with its args and env) warm if possible, else cold."""
        key = (project, egg)
        if egg is None or key in self.cold_reasons:  # None: the egg storage gives no file (not ours)
            return self._spawn_cold(process)
        warm = self.warm.get(key)
        if warm is None or not warm.alive:
            while len(self.warm) >= self.max_processes:
                self.warm.popitem(last=False)[1].retire()
            try:
                warm = self.warm[key] = WarmProcess(self, key)
            except Exception as e:  # noqa: BLE001 - e.g. out of file descriptors: this crawl goes cold
                log.error("Could not start a warm process of project {project}: {error}", project=project, error=e)
                return self._spawn_cold(process)
        self.warm.move_to_end(key)
        if not warm.ready or not warm.fork(process):  # importing still: a cold spawn starts now, never later
            self._spawn_cold(process)

    def spawn_cold(self, process, signals=()) -> None:
        """A crawl its warm process never forked: cold, with the signals it was sent meanwhile."""
        try:
            self._spawn_cold(process)
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
