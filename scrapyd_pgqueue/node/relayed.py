"""A child process started by another process (the node's spawner, or a warm process) as the node sees it: its
transport (``RelayedProcess``: its pid once started, its output pipes, its signals sent through that process, its end
as Twisted reports a child's), and the messages of the SOCK_SEQPACKET sockets those processes answer on.
"""

from __future__ import annotations

import json
import os
import signal
import socket

from twisted.internet import error, main, protocol
from twisted.internet.process import ProcessReader
from twisted.logger import Logger
from twisted.python.failure import Failure

log = Logger()


class RelayedProcess:
    """The transport of a child started by another process (the spawner, or a warm process): its output pipes, its
    pid once started, its signals sent through that process, its end as Twisted would report it."""

    number = None
    signaller = None  # how a signal reaches it (set by whoever starts it)
    forked = False  # forked from a warm process (which reports its spider's opening, whatever the runner)

    def __init__(self, process: protocol.ProcessProtocol, pipes: dict[int, int]):
        from twisted.internet import reactor

        self.process = process
        self.pid = None
        self.status = None  # waitpid's status, once known
        self.ended = False
        self.pending_signals: list[int] = []  # signalled before its pid was known: sent right after
        self.readers = {name: ProcessReader(reactor, self, name, fd) for name, fd in pipes.items()}
        process.transport = self  # cancel.json may signal it before its pid is known

    def started(self, pid: int) -> None:
        self.pid = pid
        self.process.makeConnection(self)
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
            self.signaller(number)
        except OSError:
            raise error.ProcessExitedAlready() from None

    def childDataReceived(self, name, data) -> None:
        self.process.childDataReceived(name, data)

    def childConnectionLost(self, name, reason) -> None:
        os.close(self.readers.pop(name).fd)
        self.process.childConnectionLost(name)
        self._maybe_ended()

    def close_pipes(self) -> None:
        """Never started after all: stop reading (a new start makes its own pipes)."""
        for reader in self.readers.values():
            reader.stopReading()
            os.close(reader.fd)
        self.readers.clear()

    def could_not_start(self, reason: str) -> None:
        log.error("Could not start a process of project {project}: {reason}",
                  project=getattr(self.process, "project", "?"), reason=reason)
        self.close_pipes()
        self.exited(127 << 8)

    def exited(self, status: int) -> None:
        self.status = status
        self._maybe_ended()

    def parent_died(self) -> None:
        """The process that started it died: a warm process's crawls die with it (PR_SET_PDEATHSIG)."""
        self.process.warm_parent_died = True
        self.exited(signal.SIGKILL)

    def _maybe_ended(self) -> None:
        """As Twisted: processEnded once it has exited and its pipes are closed (all output read)."""
        if self.ended or self.readers or self.status is None:
            return
        self.ended = True
        code = os.WEXITSTATUS(self.status) if os.WIFEXITED(self.status) else None
        number = None if os.WIFEXITED(self.status) else os.WTERMSIG(self.status)
        reason = error.ProcessTerminated(code, number, self.status) if code or number else error.ProcessDone(
            self.status)
        self.process.processEnded(Failure(reason))


def read_messages(sock: socket.socket, received) -> object:
    """``doRead`` of a SOCK_SEQPACKET socket of JSON messages (the spawner's, a warm process's): each one to
    ``received``, until none is left (None) or the socket is closed (Twisted's reason)."""
    while True:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return None
        except OSError:
            return main.CONNECTION_LOST
        if not data:
            return main.CONNECTION_DONE
        received(json.loads(data))


def pipes(names) -> tuple[dict[int, int], dict[int, int]]:
    """A pipe per child descriptor in ``names``: (our read ends, their write ends), by the child's numbers."""
    ours, theirs = {}, {}
    for name in names:
        ours[name], theirs[name] = os.pipe()
    return ours, theirs


def close_all(fds) -> None:
    for fd in fds:
        os.close(fd)
