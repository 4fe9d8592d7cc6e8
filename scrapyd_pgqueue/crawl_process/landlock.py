"""Linux Landlock for a crawl: it restricts its own file system access before the spider's code loads.

A crawl runs untrusted spider code as the node's user, so file permissions cannot keep it out of the node's
directories. Landlock can, with no privilege: a process gives up rights for itself and every process it starts
later, and cannot take them back. Three syscalls through ctypes (no PyPI package); imported in the crawl process
before Scrapy installs its reactor, so nothing of Twisted or of the rest of the package is imported here.

Only file system rights are handled, and only those the running kernel knows (the kernel documentation's best-effort
pattern). The network is left alone (crawls need it), and ``scoped`` is 0 (abstract Unix sockets and signals stay
open). Connecting to a named Unix socket is not a file system access Landlock checks up to ABI 7: a restricted crawl
still connects to its node's socket wherever it lies (tests/test_landlock.py checks it on the running kernel); only
binding a new one needs MAKE_SOCK beneath a writable directory. A later ABI's right on Unix sockets would not be
handled here, since only the rights listed below are.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Iterable

# Syscall numbers: the same on x86_64 and aarch64 (the generic table), which are the machines crawls run on.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
O_PATH = getattr(os, "O_PATH", 0o10000000)

ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_WRITE_FILE = 1 << 1
ACCESS_FS_READ_FILE = 1 << 2
ACCESS_FS_READ_DIR = 1 << 3
ACCESS_FS_REMOVE_DIR = 1 << 4
ACCESS_FS_REMOVE_FILE = 1 << 5
ACCESS_FS_MAKE_CHAR = 1 << 6
ACCESS_FS_MAKE_DIR = 1 << 7
ACCESS_FS_MAKE_REG = 1 << 8
ACCESS_FS_MAKE_SOCK = 1 << 9
ACCESS_FS_MAKE_FIFO = 1 << 10
ACCESS_FS_MAKE_BLOCK = 1 << 11
ACCESS_FS_MAKE_SYM = 1 << 12
ACCESS_FS_REFER = 1 << 13  # ABI 2: rename and link across directories
ACCESS_FS_TRUNCATE = 1 << 14  # ABI 3
ACCESS_FS_IOCTL_DEV = 1 << 15  # ABI 5

# The file system rights each ABI handles (ABI 4, 6 and 7 added network, scopes and logging, none of them here).
ACCESS_FS_ABI_1 = (1 << 13) - 1
FS_RIGHTS_BY_ABI = {
    1: ACCESS_FS_ABI_1,
    2: ACCESS_FS_ABI_1 | ACCESS_FS_REFER,
    3: ACCESS_FS_ABI_1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE,
    5: ACCESS_FS_ABI_1 | ACCESS_FS_REFER | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV,
}
# The only rights a rule on a file (not a directory) may grant: the kernel rejects the others with EINVAL.
FILE_RIGHTS = (
    ACCESS_FS_EXECUTE | ACCESS_FS_WRITE_FILE | ACCESS_FS_READ_FILE | ACCESS_FS_TRUNCATE | ACCESS_FS_IOCTL_DEV
)
READ_RIGHTS = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR

SYSTEM_DIRECTORIES = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/opt")
KERNEL_DIRECTORIES = ("/proc", "/sys")
# /etc files that may be symlinks to elsewhere (systemd-resolved's /run/...): Landlock checks the target.
ETC_LINKS = ("/etc/resolv.conf", "/etc/hosts")


class RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # packed in the kernel's header: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _syscall(number: int, *args) -> int:
    """The syscall's result; OSError with its errno when it fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def abi_version() -> int:
    """The Landlock ABI version of the running kernel; 0 when it has none (not built, or disabled at boot)."""
    if sys.platform != "linux" or os.uname().machine not in ("x86_64", "aarch64"):
        return 0
    try:
        return _syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    except OSError as error:
        if error.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def handled_fs_rights(abi: int) -> int:
    """The file system rights ABI ``abi`` knows (the newest listed one at or below it)."""
    return FS_RIGHTS_BY_ABI[max(version for version in FS_RIGHTS_BY_ABI if version <= abi)]


def _add_path_rule(ruleset_fd: int, path: str, rights: int) -> None:
    """Grant ``rights`` beneath ``path`` (only the file rights when it is a file); skip it when it does not exist."""
    try:
        path_fd = os.open(path, O_PATH | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        if not stat.S_ISDIR(os.fstat(path_fd).st_mode):
            rights &= FILE_RIGHTS
        rule = PathBeneathAttr(allowed_access=rights, parent_fd=path_fd)
        _syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                 ctypes.byref(rule), ctypes.c_uint32(0))
    except OSError as error:
        if error.errno != errno.EBADFD:
            raise
        # A file of no mounted file system (the sealed egg, a memory file on sys.path as /proc/self/fd/N): Landlock
        # takes no rule for it, and restricts no access to it either.
    finally:
        os.close(path_fd)


def _only_thread() -> None:
    """Landlock (up to ABI 7) restricts the calling thread only: another thread would keep every right."""
    threads = os.listdir("/proc/self/task")
    if len(threads) > 1:
        raise RuntimeError(f"Landlock would restrict one of this process's {len(threads)} threads only")


def restrict(readable: Iterable[str], writable: Iterable[str]) -> int:
    """Restrict this process (and every process it starts later) to reading/executing beneath `readable`
    and reading/writing/creating/removing beneath `writable`; returns the ABI version enforced, 0 when the
    kernel offers none (nothing restricted). A path that does not exist is skipped.

    Call it while the process has one thread (RuntimeError otherwise). Files already open stay usable."""
    abi = abi_version()
    if abi == 0:
        return 0
    _only_thread()
    handled = handled_fs_rights(abi)
    ruleset = RulesetAttr(handled_access_fs=handled, handled_access_net=0, scoped=0)
    ruleset_fd = _syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(ruleset), ctypes.c_size_t(ctypes.sizeof(ruleset)),
                          ctypes.c_uint32(0))
    try:
        for path in readable:
            _add_path_rule(ruleset_fd, path, READ_RIGHTS & handled)
        for path in writable:
            _add_path_rule(ruleset_fd, path, handled)
        # Required without CAP_SYS_ADMIN; with it, still wanted: no setuid binary may regain what is given up.
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(error)}")
        _syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0))
    finally:
        os.close(ruleset_fd)
    return abi


def _module_roots() -> list[str]:
    """Where the already-imported modules come from: each top-level package's directories, or a lone module's file
    (an editable install's source tree is on no ``sys.path`` entry; its modules not imported yet are found there)."""
    roots = []
    for name, module in list(sys.modules.items()):
        if "." in name or module is None:
            continue
        paths = list(getattr(module, "__path__", None) or ())
        if not paths and isinstance(getattr(module, "__file__", None), str):
            paths = [module.__file__]
        roots.extend(path for path in paths if isinstance(path, str) and os.path.isabs(path))
    return roots


def _beneath(path: str, directories: list[str]) -> bool:
    return any(path == directory or path.startswith(directory.rstrip("/") + "/") for directory in directories)


def crawl_readable_paths(*, include_cwd: bool = False) -> list[str]:
    """The system and Python paths a crawl must read: the system directories that exist, /proc, /sys, the Python
    installation, every existing entry of ``sys.path`` (a directory, or a file such as the project's egg), and the
    packages already imported from elsewhere. The current directory (``''`` on ``sys.path``) only if asked."""
    cwd = os.getcwd()
    paths = [path for path in SYSTEM_DIRECTORIES if os.path.exists(path)] + list(KERNEL_DIRECTORIES)
    paths += [os.path.realpath(path) for path in ETC_LINKS if os.path.islink(path)]
    paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))]
    for entry in sys.path:
        if entry and os.path.isabs(entry) and os.path.exists(entry) and (include_cwd or entry != cwd):
            paths.append(entry)
    if include_cwd:
        paths.append(cwd)
    resolved = [os.path.realpath(path) for path in paths]
    for root in _module_roots():
        real_root = os.path.realpath(root)
        if os.path.exists(real_root) and not _beneath(real_root, resolved) and real_root != cwd:
            paths.append(real_root)
            resolved.append(real_root)
    return list(dict.fromkeys(path for path in paths if path))
