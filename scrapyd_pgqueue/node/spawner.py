"""The one part of a node that may switch users: it starts the node's crawls, ``scrapy list`` runs and warm processes.

A spider is untrusted code. A node started as root (``crawl_users = on``) starts this process first, then drops its
own privileges to ``node_user`` before it reads a request (``node/spawning.py``): the part that faces the network
parses requests unprivileged, and the right to switch users lives here, in a process that reads nothing but its
node's messages. Every child runs under its project's uid (from ``crawl_uid_range``, the same on every node), in no
group but its own, in a fresh directory of its own that is its working directory and ``HOME``. Where the node cannot
switch users, this process runs as the node's user and does the same, less the switch: one trust domain.

Children are started isolated: ``python -s -P`` (no user site, no working directory on ``sys.path``), stdin from
/dev/null, the descriptors the node sends (stdout, stderr, stats, the launch channel, the egg) at the numbers it
names, and every other descriptor closed. Directories a project's crawls write to (``logs_dir/<project>``,
``items_dir/<project>``, ``jobs_dir/<project>``) are the project's uid's, in the node's group (the node reads and
prunes the logs), and ``crawls_dir/<project>`` holds its crawls' own directories; each is made here through
descriptors opened without following links, so a link planted by a crawl never turns root's ``chown`` elsewhere.

The protocol, on a SOCK_SEQPACKET pair (JSON, descriptors attached with SCM_RIGHTS):

* node -> here: ``{"start": n, "argv": [...], "env": {...}, "project": P, "uid": U or null, "scratch": name or
  null, "fds": [target, ...], "hold_cancels": whether it starts with SIGINT and SIGTERM blocked}`` with one
  descriptor per target; ``{"signal": n, "number": s}``; end of stream: the
  node is gone, this process leaves (its children run on, as Scrapyd's crawls outlive it);
* here -> node: ``{"start": n, "pid": p}`` or ``{"start": n, "error": reason}``, then ``{"start": n, "status": s}``
  (``waitpid``'s status) once the child has exited.

Stdlib only (and the signals a crawl expects blocked, from ``crawl_process/early_cancel.py``, itself stdlib only),
nothing of the node: it is started as ``python -s -P -m scrapyd_pgqueue.node.spawner CONFIG``
(JSON: whether it switches users, the node's group, the uid range, the base directories, its socket's descriptor).
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import sys

from scrapyd_pgqueue.crawl_process.early_cancel import CANCEL_SIGNALS

MAX_MESSAGE = 4 * 1024 * 1024  # a start request: a crawl's environment, never its arguments (the launch channel)
MAX_FDS = 8
# Python's flags for every child: no user site-packages, and no working directory (nor script directory) on sys.path,
# so a module or .pth file a crawl leaves behind is never imported by another process.
ISOLATED = ("-s", "-P")
# Files a crawl makes are its own and its node's group's to read (the node serves its log), no one else's.
CRAWL_UMASK = 0o027
SCRATCH_VARIABLE = "SCRAPYD_PGQUEUE_SCRATCH"  # the child's own directory (its cwd, HOME and TMPDIR)


class Refused(Exception):
    """A start request this process will not carry out (the node is told why)."""


def valid_name(name: str) -> str:
    """A project or scratch directory name that stays one directory entry below its base."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\0" in name or len(name) > 200:
        raise Refused(f"not a usable directory name: {name!r}")
    return name


def open_base(path: str, uid: int, gid: int, mode: int) -> int:
    """The descriptor of a base directory (``logs_dir`` ...), made if missing and given to ``uid``:``gid``."""
    os.makedirs(path, exist_ok=True)
    descriptor = open_directory(path)
    own(descriptor, uid, gid, mode)
    return descriptor


def own(descriptor: int, uid: int, gid: int, mode: int) -> None:
    """Give a directory (by descriptor: never a path a crawl could turn) its owner and mode, when they differ. The
    mode first, while it may still be root's (the setgid bit is kept only for a member of the directory's group)."""
    info = os.fstat(descriptor)
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, gid, mode):
        return
    path = f"/proc/self/fd/{descriptor}"  # an O_PATH descriptor's own file (no fchmod or fchown on those)
    os.chmod(path, mode)
    if (info.st_uid, info.st_gid) != (uid, gid) and os.geteuid() == 0:
        os.chown(path, uid, gid)


def open_directory(name: str, base: int | None = None) -> int:
    """A descriptor of the directory itself, without following a link and without reading it: root here may hold
    no right to read other users' directories (no CAP_DAC_READ_SEARCH), only to own and switch to them."""
    return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base)


def project_directory(base: int, project: str, uid: int, gid: int, mode: int) -> int:
    """The descriptor of ``base/project``, made if missing, owned by the project's uid and ``gid``."""
    try:
        os.mkdir(project, 0o700, dir_fd=base)
    except FileExistsError:
        pass
    try:
        descriptor = open_directory(project, base)
    except OSError as e:
        raise Refused(f"{project!r} is not a directory of its own ({e.strerror})") from None
    own(descriptor, uid, gid, mode)
    return descriptor


def unreachable_by_others(paths) -> list[str]:
    """Of ``paths`` (the interpreter and the code a crawl runs), those a user other than their owner cannot reach:
    a directory on the way without search permission for others, or a file others cannot read."""
    unreachable = []
    for path in paths:
        path = os.path.realpath(path)
        parts = [path, *_parents(path)]
        for part in parts:
            try:
                mode = os.stat(part).st_mode
            except OSError:
                continue
            wanted = 0o001 if part != path or os.path.isdir(part) else 0o004
            if not mode & wanted:
                unreachable.append(part)
                break
    return sorted(set(unreachable))


def _parents(path: str):
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return
        yield parent
        path = parent


def crawl_code_paths() -> list[str]:
    """What a crawl under another uid must read: the interpreter, the standard library and this package."""
    import importlib.util

    return [sys.executable, os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(__file__)),
            os.path.dirname(importlib.util.find_spec("scrapy").origin)]


class Spawner:
    def __init__(self, control: socket.socket, config: dict):
        self.control = control
        self.switch = config["switch"]  # whether children run under their project's uid
        self.node_gid = config["node_gid"]
        self.first_uid, self.last_uid = config["uids"]
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, tuple[int, int, str | None]] = {}  # pidfd -> (request, pid, scratch to remove)
        self.pids: dict[int, int] = {}  # request -> pid, while it runs
        me = os.geteuid(), os.getegid()
        if self.switch:  # a member of the node's group: the projects' shared directories keep their setgid bit
            os.setgroups([self.node_gid])
        # Bases: the node's group reads them (logs), crawls may only pass through (--x), none lists the others.
        owner, group = (0, self.node_gid) if self.switch else me
        self.bases = {kind: open_base(path, owner, group, 0o751 if self.switch else 0o700)
                      for kind, path in config["dirs"].items() if path}

    # --- requests ---------------------------------------------------------------------------------------------

    def serve(self) -> None:
        self.selector.register(self.control, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.control:
                    if not self.receive():
                        return
                else:
                    self.reap(key.fd)

    def receive(self) -> bool:
        data, fds, _, _ = socket.recv_fds(self.control, MAX_MESSAGE, MAX_FDS)
        if not data:
            return False
        request = json.loads(data)
        try:
            if "signal" in request:
                self.signal(request["signal"], request["number"])
            else:
                self.start(request, fds)
        except (Refused, OSError) as e:
            if "start" in request:
                self.send({"start": request["start"], "error": str(e)})
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def signal(self, number: int, signal_number: int) -> None:
        pid = self.pids.get(number)
        if pid is not None:  # not reaped yet, so the pid is still this child's
            os.kill(pid, signal_number)

    def start(self, request: dict, fds: list[int]) -> None:
        uid = self.crawl_uid(request.get("uid"))
        project = valid_name(request["project"])
        scratch = request.get("scratch")
        if scratch is not None:
            valid_name(scratch)
        targets = request["fds"]
        if len(targets) != len(fds) or not all(isinstance(t, int) and 0 < t < 64 for t in targets):
            raise Refused("one descriptor per target, each above 0")
        crawls = self.prepare(project, uid)
        try:
            pid = os.fork()
            if pid == 0:
                self.run_child(request, dict(zip(targets, fds)), uid, crawls, scratch)  # never returns
        finally:
            os.close(crawls)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (request["start"], pid, scratch and f"{project}/{scratch}")
        self.pids[request["start"]] = pid
        self.selector.register(pidfd, selectors.EVENT_READ)
        self.send({"start": request["start"], "pid": pid})

    def crawl_uid(self, uid) -> int:
        if not self.switch:
            return os.geteuid()
        if not isinstance(uid, int) or not self.first_uid <= uid <= self.last_uid:
            raise Refused(f"uid {uid!r} is outside crawl_uid_range {self.first_uid}-{self.last_uid}")
        return uid

    def prepare(self, project: str, uid: int) -> int:
        """The project's directories, made or mended; the descriptor of its crawls' directory."""
        gid = self.node_gid if self.switch else os.getegid()
        shared = 0o2770 if self.switch else 0o700  # the node's group reads and prunes; setgid: new files too
        for kind in ("logs", "items", "jobs"):
            if kind in self.bases:
                os.close(project_directory(self.bases[kind], project, uid, gid, shared))
        own_group = uid if self.switch else gid
        return project_directory(self.bases["crawls"], project, uid, own_group, 0o700)

    def run_child(self, request: dict, fds: dict[int, int], uid: int, crawls: int, scratch: str | None) -> None:
        """The child: its descriptors, its user, its directory, then exec. Never returns."""
        try:
            crawls = os.dup2(crawls, 127)
            for target, fd in fds.items():  # through numbers above any target first: targets may overlap sources
                os.dup2(fd, 64 + target)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for target in fds:
                os.dup2(64 + target, target)
            low = 3  # every other descriptor closed (this process's socket, its children's pidfds)
            for keep in sorted({*fds, crawls}):
                os.closerange(low, keep)
                low = max(low, keep + 1)
            os.closerange(low, os.sysconf("SC_OPEN_MAX"))
            if self.switch:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            os.fchdir(crawls)  # as the project's user: its directory is its own (mode 0700)
            os.close(crawls)
            os.umask(CRAWL_UMASK)
            env = dict(request["env"])
            if scratch is not None:
                os.mkdir(scratch, 0o700)
                os.chdir(scratch)
                env.update({"HOME": os.getcwd(), "TMPDIR": os.getcwd(), SCRATCH_VARIABLE: os.getcwd()})
            for number in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):  # ignored here, default in a new Python
                signal.signal(number, signal.SIG_DFL)
            # For the node's own programs, a cancel waits, pending, until their handlers are in place
            # (crawl_process/early_cancel.py).
            signal.pthread_sigmask(signal.SIG_SETMASK, CANCEL_SIGNALS if request.get("hold_cancels") else [])
            os.execve(request["argv"][0], request["argv"], env)
        except BaseException as e:  # noqa: BLE001 - the node reads it as the crawl's own stderr
            os.write(2, f"could not start: {type(e).__name__}: {e}\n".encode(errors="replace"))
        os._exit(127)

    def reap(self, pidfd: int) -> None:
        number, pid, scratch = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        del self.pids[number]
        if scratch is not None:
            self.remove_scratch(scratch)
        self.send({"start": number, "status": status})

    def remove_scratch(self, path: str) -> None:
        """A child's directory goes with it; removed as the child's user (root never walks a crawl's tree)."""
        project, _ = path.split("/", 1)
        pid = os.fork()
        if pid == 0:
            try:
                os.fchdir(self.bases["crawls"])
                if self.switch:
                    info = os.stat(project, follow_symlinks=False)
                    os.setgroups([])
                    os.setresgid(info.st_gid, info.st_gid, info.st_gid)
                    os.setresuid(info.st_uid, info.st_uid, info.st_uid)
                shutil.rmtree(path)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)

    def send(self, message: dict) -> None:
        try:
            self.control.send(json.dumps(message).encode())
        except OSError as e:
            if e.errno != errno.EPIPE:
                raise


def main() -> None:
    config = json.loads(sys.argv[1])
    control = socket.socket(fileno=config["control"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the node, which ends this process by leaving
    spawner = Spawner(control, config)
    control.send(json.dumps({"ready": os.getpid()}).encode())
    spawner.serve()


if __name__ == "__main__":
    main()
