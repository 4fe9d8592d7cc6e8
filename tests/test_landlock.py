"""Landlock on the running kernel: each case restricts a fresh Python process, tries things, and prints what happened.

No mocks: this machine and CI have a Landlock kernel, so ``abi_version() == 0`` fails (a skip would hide a crawl
running unrestricted). The tests run as root, which Landlock restricts all the same (it is not DAC).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scrapyd_pgqueue.crawl_process import landlock

# Runs in the child before the case's body: restrict to the system paths plus the case's own, then `attempt` records
# each try as ["ok", value] or [exception name, errno].
PRELUDE = """
import json, os, subprocess, sys
from scrapyd_pgqueue.crawl_process.landlock import crawl_readable_paths, restrict
readable, writable = json.loads(sys.argv[1]), json.loads(sys.argv[2])
result = {"abi": restrict(crawl_readable_paths() + readable, writable)}
def attempt(name, action):
    try:
        result[name] = ["ok", action()]
    except OSError as error:
        result[name] = [type(error).__name__, error.errno]
def write(path, text="x"):
    with open(path, "w") as file:
        return file.write(text)
def read(path):
    with open(path) as file:
        return file.read()
"""


def run_restricted(tmp_path: Path, body: str, readable=(), writable=(), pass_fds=()) -> dict:
    """The JSON result of ``body`` run (after PRELUDE) in a child restricted to ``readable`` and ``writable``."""
    code = PRELUDE + body + "\nprint(json.dumps(result))\n"
    args = [sys.executable, "-c", code, json.dumps([str(p) for p in readable]), json.dumps([str(p) for p in writable])]
    # The cwd is a directory no rule names: '' on sys.path must not make it readable.
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120, pass_fds=pass_fds)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["abi"] == landlock.abi_version() >= 1
    return result


@pytest.fixture
def dirs(tmp_path):
    """writable/, readable/ (with a file), secret/ (with a file), other/: a crawl's and the node's directories."""
    made = {name: tmp_path / name for name in ("writable", "readable", "secret", "other")}
    for path in made.values():
        path.mkdir()
    (made["readable"] / "data.txt").write_text("readable")
    (made["secret"] / "key.txt").write_text("secret")
    return made


def test_kernel_has_landlock():
    abi = landlock.abi_version()
    if abi < 1:
        pytest.fail("This kernel offers no Landlock (abi_version() == 0): crawls would run unrestricted. "
                    "Run on a kernel built with CONFIG_SECURITY_LANDLOCK and 'landlock' in its lsm= list.")


def test_writes_only_beneath_writable(tmp_path, dirs):
    body = f"""
w, r, o = {str(dirs["writable"])!r}, {str(dirs["readable"])!r}, {str(dirs["other"])!r}
attempt("write", lambda: write(w + "/a.txt", "hello"))
attempt("read_back", lambda: read(w + "/a.txt"))
attempt("mkdir", lambda: os.mkdir(w + "/sub"))
attempt("rename", lambda: os.rename(w + "/a.txt", w + "/sub/b.txt"))
attempt("remove", lambda: os.remove(w + "/sub/b.txt"))
attempt("create_outside", lambda: write(o + "/a.txt"))
attempt("mkdir_outside", lambda: os.mkdir(o + "/sub"))
attempt("overwrite_readable", lambda: write(r + "/data.txt"))
attempt("dev_null", lambda: write("/dev/null"))
"""
    result = run_restricted(tmp_path, body, readable=[dirs["readable"]], writable=[dirs["writable"], "/dev"])
    assert result["write"] == ["ok", 5]
    assert result["read_back"] == ["ok", "hello"]
    for name in ("mkdir", "rename", "remove", "dev_null"):
        assert result[name][0] == "ok", (name, result[name])
    for name in ("create_outside", "mkdir_outside", "overwrite_readable"):
        assert result[name] == ["PermissionError", 13], (name, result[name])
    assert not list(dirs["other"].iterdir())


def test_reads_only_beneath_readable_or_writable(tmp_path, dirs):
    single = tmp_path / "single.txt"
    single.write_text("one file")
    (tmp_path / "sibling.txt").write_text("not granted")
    body = f"""
attempt("readable", lambda: read({str(dirs["readable"] / "data.txt")!r}))
attempt("list_readable", lambda: os.listdir({str(dirs["readable"])!r}))
attempt("secret", lambda: read({str(dirs["secret"] / "key.txt")!r}))
attempt("list_secret", lambda: os.listdir({str(dirs["secret"])!r}))
attempt("single_file", lambda: read({str(single)!r}))
attempt("sibling", lambda: read({str(tmp_path / "sibling.txt")!r}))
attempt("cwd", lambda: os.listdir("."))
"""
    result = run_restricted(tmp_path, body, readable=[dirs["readable"], single])
    assert result["readable"] == ["ok", "readable"]
    assert result["list_readable"] == ["ok", ["data.txt"]]
    assert result["single_file"] == ["ok", "one file"]  # a file rule gets the file rights only, which the kernel takes
    for name in ("secret", "list_secret", "sibling", "cwd"):
        assert result[name] == ["PermissionError", 13], (name, result[name])


def test_executes_system_binaries_and_imports(tmp_path):
    body = """
import importlib
attempt("uname", lambda: subprocess.run(["/usr/bin/uname", "-p"], capture_output=True, text=True).returncode)
for module in ("decimal", "xml.dom.minidom", "sqlite3", "scrapy", "scrapy.crawler", "scrapy.http"):
    attempt(module, lambda: importlib.import_module(module).__name__)
"""
    result = run_restricted(tmp_path, body)
    assert result["uname"] == ["ok", 0]
    for module in ("decimal", "xml.dom.minidom", "sqlite3", "scrapy", "scrapy.crawler", "scrapy.http"):
        assert result[module] == ["ok", module]


def test_children_inherit_the_restriction(tmp_path, dirs):
    child = (
        "import sys\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        open(path, 'w').close(); print('ok')\n"
        "    except PermissionError:\n"
        "        print('denied')\n"
    )
    body = f"""
paths = [{str(dirs["writable"] / "child.txt")!r}, {str(dirs["other"] / "child.txt")!r}]
attempt("child", lambda: subprocess.run([sys.executable, "-c", {child!r}, *paths],
                                        capture_output=True, text=True, check=True).stdout.split())
"""
    result = run_restricted(tmp_path, body, writable=[dirs["writable"]])
    assert result["child"] == ["ok", ["ok", "denied"]]
    assert not (dirs["other"] / "child.txt").exists()


def test_missing_paths_are_skipped(tmp_path, dirs):
    body = f"""attempt("write", lambda: write({str(dirs["writable"] / "a.txt")!r}))"""
    missing = [tmp_path / "absent", tmp_path / "absent" / "deeper", dirs["readable"] / "data.txt" / "not-a-dir"]
    result = run_restricted(tmp_path, body, readable=missing, writable=[*missing, dirs["writable"]])
    assert result["write"] == ["ok", 1]


def test_connects_to_a_unix_socket_outside_the_allowed_paths(tmp_path, dirs):
    """A crawl talks to its node over a named Unix socket in the node's directory: Landlock (up to ABI 7, with
    ``scoped`` at 0) does not check connect(), only bind() (MAKE_SOCK), so the connection works."""
    node_socket = dirs["secret"] / "node.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(node_socket))
        server.listen()  # the child's connection waits in the backlog until accepted below
        body = f"""
import socket
def connect():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect({str(node_socket)!r})
        return client.sendall(b"hello node")
def bind_outside():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind({str(dirs["other"] / "new.sock")!r})
attempt("connect", connect)
attempt("bind_outside", bind_outside)
"""
        result = run_restricted(tmp_path, body, writable=[dirs["writable"]])
        server.settimeout(10)
        connection, _ = server.accept()
        with connection:
            received = connection.recv(100)
    assert result["connect"] == ["ok", None], "a restricted crawl could not reach its node's Unix socket"
    assert received == b"hello node"
    assert result["bind_outside"] == ["PermissionError", 13]


def test_memfd_reopened_through_proc_after_restriction(tmp_path):
    """A memfd lives on the kernel's internal tmpfs mount (SB_NOUSER), which Landlock exempts: reopening it through
    /proc/self/fd works under the restriction, for reading and for writing."""
    memfd = os.memfd_create("landlock-test")
    try:
        os.write(memfd, b"in memory")
        body = f"""
attempt("reopen_read", lambda: open("/proc/self/fd/{memfd}", "rb").read().decode())
attempt("reopen_write", lambda: open("/proc/self/fd/{memfd}", "r+b").write(b"IN"))
"""
        result = run_restricted(tmp_path, body, pass_fds=[memfd])
        assert result["reopen_read"] == ["ok", "in memory"]
        assert result["reopen_write"] == ["ok", 2]
        assert os.pread(memfd, 9, 0) == b"IN memory"
    finally:
        os.close(memfd)


def test_refuses_to_restrict_one_thread_of_many(tmp_path):
    """Landlock restricts the calling thread only: with another thread alive, restrict() raises rather than leave it
    unrestricted."""
    code = (
        "import threading, time\n"
        "from scrapyd_pgqueue.crawl_process.landlock import restrict\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "try:\n"
        "    restrict([], [])\n"
        "except RuntimeError as error:\n"
        "    print('refused', error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("refused"), (done.stdout, done.stderr)


def test_crawl_readable_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    paths = landlock.crawl_readable_paths()
    assert all(os.path.isabs(path) for path in paths)
    assert str(tmp_path) not in paths and "" not in paths
    for path in ("/usr", "/etc", "/proc", "/sys", sys.prefix, sys.base_prefix, os.path.dirname(landlock.__file__)):
        assert any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths), path
    assert str(tmp_path) in landlock.crawl_readable_paths(include_cwd=True)
