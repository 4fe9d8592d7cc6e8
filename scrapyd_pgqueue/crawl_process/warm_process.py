"""A warm process: one project version imported once, then one fork per crawl (``warm_start = on``).

Started by the node (``node/warm.py``) as ``python -m scrapyd_pgqueue.crawl_process.warm_process FD`` with the project's
environment; FD is its end of a SOCK_SEQPACKET socket pair. It activates the egg, imports the settings module,
the spider modules and Scrapy's default components, checks that the project left no reactor, thread or socket
behind (a fork would share them), freezes the heap (``gc.freeze``: copy-on-write pages stay shared) and serves:

* node -> here: ``{"crawl": n, "args": [...], "env": {...}, "launch": {...}, "scratch": path}`` with the crawl's
  stdout, stderr and stats pipes attached (SCM_RIGHTS); ``{"signal": n, "number": s}`` (the node may run as another
  user than this process); an end of stream asks it to exit once its crawls have ended;
* here -> node: ``{"ready": pid}`` or ``{"cold": reason}`` (then it exits), ``{"crawl": n, "pid": p}`` once
  forked, ``{"crawl": n, "status": s}`` (``waitpid``'s status) once the crawl ended.

Each crawl is a fork of the same pristine process, so what one crawl changes no other sees. The child resets
what a fresh ``python -m scrapyd_pgqueue.runner crawl`` would have fresh (environment, signals, stdio, ``sys.argv``,
random state), enters its own directory and its launch (``launch.py``: its arguments, token, directories and a
narrower Landlock domain), and dies with its warm process (PR_SET_PDEATHSIG). This process restricts itself with
Landlock, to its project's directories, before it imports any of the project's code. No reactor import here: Scrapy
installs the one the spider's settings name, in the child.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import os
import random
import selectors
import shutil
import signal
import socket
import sys

from scrapyd_pgqueue.crawl_process import launch
from scrapyd_pgqueue.crawl_process.crawl_node import PROJECT_VARIABLE
from scrapyd_pgqueue.crawl_process.early_cancel import CANCEL_SIGNALS, exit_quietly_until_scrapy_handles_signals
from scrapyd_pgqueue.crawl_process.job_stats import REPORTING_RUNNER, STATS_FD
from scrapyd_pgqueue.crawl_process.not_dumpable import make_not_dumpable

PR_SET_PDEATHSIG = 1
# The protocol, written here once: the node's half (``node/warm.py``) imports it.
MAX_MESSAGE = 4 * 1024 * 1024  # a crawl's arguments and environment; the node checks the size it sends
CONTROL_FD = 3  # this process's end of its socket pair, as the node spawns it (and names it in argv)
CRAWL_FDS = 3  # the descriptors sent with a crawl request: its stdout, stderr and stats pipes, in that order
CRAWL, ARGS, ENV, LAUNCH, SCRATCH = "crawl", "args", "env", "launch", "scratch"  # the keys of a crawl request
SIGNAL, NUMBER = "signal", "number"  # the keys of a signal request
READY, COLD, PID, STATUS = "ready", "cold", "pid", "status"  # the keys of the messages here -> node
# Modules every crawl imports after its start; imported here, they cost a crawl nothing.
CRAWL_MODULES = (
    "scrapy.cmdline", "scrapy.crawler", "scrapy.commands.crawl", "scrapy.core.engine", "scrapy.core.scraper",
    "scrapy.core.downloader", "scrapy.utils.reactor", "scrapy.utils.log", "twisted.internet.asyncioreactor",
    "asyncio",
)
COMPONENT_SETTINGS = (
    "DOWNLOADER_MIDDLEWARES_BASE", "SPIDER_MIDDLEWARES_BASE", "EXTENSIONS_BASE", "DOWNLOAD_HANDLERS_BASE",
    "ITEM_PIPELINES_BASE",
)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (checked once: the parent may already be gone)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def import_project(project: str) -> None:
    """What a crawl of this project imports before its spider starts, in the order ``scrapy crawl`` does."""
    from scrapyd import runner as scrapyd_runner

    from scrapyd_pgqueue.crawl_process import frontier_outputs, stats_extension
    from scrapyd_pgqueue.one_line_config import OneLineConfig

    scrapyd_runner.Config = OneLineConfig
    scrapyd_runner.activate_egg = launch.activate_egg
    stats_extension.install()  # as the runner does for a cold crawl
    frontier_outputs.install()
    scrapyd_runner.project_environment(project).__enter__()  # the egg stays active for every crawl
    from scrapy.spiderloader import get_spider_loader
    from scrapy.utils.project import get_project_settings

    get_spider_loader(get_project_settings())  # imports the spider modules


def unsafe_to_fork(control: socket.socket) -> str:
    """Why forking this process would share something live with every crawl; '' when nothing does."""
    if "twisted.internet.reactor" in sys.modules:
        return "importing the project installs a Twisted reactor"
    threads = thread_count()
    if threads > 1:
        return f"importing the project starts {threads - 1} threads"
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:") and int(name) != control.fileno():
            return "importing the project opens a socket"
    return ""


def thread_count() -> int:
    """This process's threads as the kernel counts them: ``threading.active_count()`` misses those started with
    ``_thread`` or from C."""
    return len(os.listdir("/proc/self/task"))


def import_components() -> None:
    """Scrapy's default components (none imports the reactor): each crawl would import them itself."""
    import importlib

    from scrapy.settings import default_settings
    from scrapy.utils.misc import load_object

    for module in CRAWL_MODULES:
        importlib.import_module(module)
    for setting in COMPONENT_SETTINGS:
        for key, value in getattr(default_settings, setting).items():
            path = value if isinstance(value, str) else key
            try:
                load_object(path)
            except Exception:  # noqa: BLE001 - an optional dependency missing: the crawl imports what it needs
                pass


class WarmProcess:
    def __init__(self, control: socket.socket):
        self.control = control
        self.selector = selectors.DefaultSelector()
        self.crawls: dict[int, tuple[int, int, str]] = {}  # pidfd -> (crawl number, pid, its directory)
        self.pids: dict[int, int] = {}  # crawl number -> pid, until reaped
        self.closing = False
        # argv[0] of each crawl, as a cold crawl of the runner has it (its module is not imported here).
        self.runner_file = importlib.util.find_spec(REPORTING_RUNNER).origin

    def send(self, message: dict) -> None:
        self.control.send(json.dumps(message).encode())

    def serve(self) -> None:
        self.selector.register(self.control, selectors.EVENT_READ)
        while not (self.closing and not self.crawls):
            for key, _ in self.selector.select():
                if key.fileobj is self.control:
                    self.receive()
                else:
                    self.reap(key.fd)

    def receive(self) -> None:
        data, fds, _, _ = socket.recv_fds(self.control, MAX_MESSAGE, CRAWL_FDS)
        if not data:  # the node retires this process, or is gone
            self.selector.unregister(self.control)
            self.closing = True
            return
        request = json.loads(data)
        if SIGNAL in request:
            if request[SIGNAL] in self.pids:  # not reaped yet: the pid is still this crawl's
                os.kill(self.pids[request[SIGNAL]], request[NUMBER])
            return
        pid = os.fork()
        if pid == 0:
            self.run_crawl(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.crawls[pidfd] = (request[CRAWL], pid, request[SCRATCH])
        self.pids[request[CRAWL]] = pid
        self.selector.register(pidfd, selectors.EVENT_READ)
        self.send({CRAWL: request[CRAWL], PID: pid})

    def reap(self, pidfd: int) -> None:
        number, pid, scratch = self.crawls.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        del self.pids[number]
        shutil.rmtree(scratch, ignore_errors=True)  # the crawl's own directory goes with it
        self.send({CRAWL: number, STATUS: status})

    def run_crawl(self, request: dict, fds: list[int]) -> None:
        """The child: become what ``python -m scrapyd_pgqueue.runner crawl ...`` would be, run it, exit."""
        code = 1
        try:
            die_with_parent(self.parent_pid)
            self.control.close()
            for pidfd in self.crawls:
                os.close(pidfd)
            if len(fds) > 2:  # the stats channel on STATS_FD (job_stats.py), as a spawned crawl has it
                os.dup2(fds[2], STATS_FD)  # before stdin is opened: the control socket's CONTROL_FD is closed now
            stdin = os.open(os.devnull, os.O_RDONLY)
            os.dup2(stdin, 0)
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in (stdin, *fds):
                os.close(fd)
            signal.pthread_sigmask(signal.SIG_SETMASK, CANCEL_SIGNALS)
            exit_quietly_until_scrapy_handles_signals()  # a cancel from now on (or pending): no traceback, status 0
            settings_module = os.environ.get("SCRAPY_SETTINGS_MODULE")
            os.environ.clear()
            os.environ.update(request[ENV])
            os.environ.pop(launch.LAUNCH_VARIABLE, None)  # its launch came with the request
            if settings_module is not None:
                os.environ.setdefault("SCRAPY_SETTINGS_MODULE", settings_module)  # as the egg's activation does
            launch.enter_scratch(request[SCRATCH])
            sys.argv = [self.runner_file, *request[ARGS]]
            launch.enter(request[LAUNCH])
            random.seed()
            gc.enable()
            code = self.execute()
        except BaseException:  # noqa: BLE001 - its setup failed: said on its stderr, the crawl's log
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)  # the warm process's atexit handlers and buffers are not this crawl's

    @staticmethod
    def execute() -> int:
        from scrapy.cmdline import execute

        try:
            execute()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as the interpreter would: traceback on stderr, exit code 1
            import traceback

            traceback.print_exc()
            code = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing left to say
                pass
        return code


def main() -> None:
    make_not_dumpable()  # its forks inherit it: other crawls of the same user cannot read a crawl's memory
    control = socket.socket(fileno=int(sys.argv[1]))
    warm = WarmProcess(control)
    warm.parent_pid = os.getpid()
    die_with_parent(os.getppid())  # the node's spawner, which leaves with the node
    launch.enter(launch.read_launch())  # its Landlock domain, before the project's code
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the crawls; they outlive no node anyway
    # SIGINT and SIGTERM stay blocked, as the spawner started it: the node only ever kills it (SIGKILL), and each crawl
    # it forks unblocks them once its handlers are in place (run_crawl), so that a cancel never meets this process's.
    gc.disable()
    try:
        import_project(os.environ[PROJECT_VARIABLE])
    except BaseException as e:  # noqa: BLE001 - the crawl's own cold start reports it in its log
        warm.send({COLD: f"importing the project failed: {type(e).__name__}: {e}"})
        return
    reason = unsafe_to_fork(control)
    if reason:
        warm.send({COLD: reason})
        return
    import_components()
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    warm.send({READY: os.getpid()})
    warm.serve()


if __name__ == "__main__":
    main()
