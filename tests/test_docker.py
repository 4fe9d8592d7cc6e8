"""The Docker image and compose file, checked without a Docker engine (this machine has only the client).

The image cannot be built here, so the test replays the Dockerfile: its COPY, RUN and ENV steps build the
image's file tree under a temporary directory, then a real ``scrapyd`` runs from it with the image's
environment and command (its ENTRYPOINT, tini, then its CMD), against a real database, answers the image's HEALTHCHECK
command and crawls the baked-in example project; in a PID namespace of its own, as in a container, its entry point
reaps what crawls leave behind; and started as Compose and the chart start the image (root, with only the spawner's
capabilities, no new privileges), it drops to the image's user and runs crawls under their project's own.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import json
import os
import re
import shlex
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from configparser import ConfigParser
from pathlib import Path

import pytest
import yaml

from helpers import SYSTEM_PYTHON, children_of, image_pinned, wait_for
from scrapyd_pgqueue.local import devdb
from scrapyd_pgqueue.local.devdb import free_port

REPOSITORY = Path(__file__).resolve().parent.parent
DOCKERFILE = REPOSITORY / "Dockerfile"
DOCKERIGNORE = REPOSITORY / ".dockerignore"
COMPOSE_FILE = REPOSITORY / "docker-compose.yml"


# --- reading the Dockerfile ------------------------------------------------------------------------------------


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].strip() + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        pending = ""
    return instructions


def ignored_by_dockerignore(relative: str) -> bool:
    """Whether Docker leaves ``relative`` (a path in the build context) out of the context."""
    patterns = [p.strip().lstrip("/") for p in DOCKERIGNORE.read_text().splitlines()]
    parts = Path(relative).parts
    for pattern in (p for p in patterns if p and not p.startswith("#")):
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch(part, pattern[3:]) for part in parts):
                return True
        elif fnmatch.fnmatch(relative, pattern) or relative.startswith(pattern.rstrip("/") + "/"):
            return True
    return False


class ImageReplay:
    """The image's file tree and settings, built under ``root`` by replaying the Dockerfile's steps."""

    def __init__(self, root: Path):
        self.root = root
        self.workdir = "/"
        self.env: dict[str, str] = {}
        self.user = "root"
        self.home: str | None = None
        self.users: dict[str, int] = {}  # the accounts the image adds (its /etc/passwd): name -> uid
        self.setuid_stripped = False  # no setuid or setgid program is left in the image
        self.installed = False
        self.exposed: list[str] = []
        self.healthcheck: list[str] | None = None  # what Docker runs (exec form; a shell form through sh -c)
        self.cmd: list[str] | None = None
        self.entrypoint: list[str] = []
        self.packages: list[str] = []  # Debian packages the image installs
        self.base: str | None = None

    @property
    def command(self) -> list[str]:
        """What the container runs: the entry point, then the command."""
        return self.entrypoint + self.cmd

    def path(self, image_path: str) -> Path:
        """Where a path of the image lives under ``root``."""
        absolute = image_path if image_path.startswith("/") else f"{self.workdir.rstrip('/')}/{image_path}"
        return self.root / absolute.lstrip("/")

    def replay(self, instructions) -> ImageReplay:
        for keyword, arguments in instructions:
            getattr(self, f"_{keyword.lower()}")(arguments)
        return self

    def _from(self, arguments):
        self.base = arguments

    def _workdir(self, arguments):
        self.workdir = arguments if arguments.startswith("/") else f"{self.workdir.rstrip('/')}/{arguments}"
        self.path(self.workdir).mkdir(parents=True, exist_ok=True)

    def _env(self, arguments):
        for assignment in shlex.split(arguments):
            key, equals, value = assignment.partition("=")
            assert equals, f"ENV {arguments!r}: only the KEY=value form is replayed"
            self.env[key] = value

    def _copy(self, arguments):
        *sources, destination = shlex.split(arguments)
        for source in sources:
            assert (REPOSITORY / source).exists(), f"COPY {source}: not in the build context"
            assert not ignored_by_dockerignore(source), f"COPY {source}: excluded by .dockerignore"
            target = self.path(destination)
            if (REPOSITORY / source).is_dir():
                shutil.copytree(
                    REPOSITORY / source,
                    target,
                    dirs_exist_ok=True,
                    ignore=lambda directory, names: [
                        name for name in names
                        if ignored_by_dockerignore(str((Path(directory) / name).relative_to(REPOSITORY)))
                    ],
                )
            else:
                if destination.endswith("/") or destination in (".", "./"):
                    target = target / Path(source).name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPOSITORY / source, target)

    def _run(self, arguments):
        for command in (c.strip() for c in arguments.split("&&")):
            words = shlex.split(command)
            if words[:3] == ["pip", "install", "."]:
                # pip install is too slow for a test; the package is installed from this repository already.
                # What the step needs is the package's build files in the working directory.
                assert self.path("pyproject.toml").is_file() and self.path("scrapyd_pgqueue/__init__.py").is_file()
                self.installed = True
            elif words[:2] == ["apt-get", "update"]:
                pass  # the package lists, for the install that follows
            elif words[:2] == ["apt-get", "install"]:
                # The same Debian package installed here (.ci/run installs it) stands for the image's.
                for package in (word for word in words[2:] if not word.startswith("-")):
                    assert shutil.which(package), f"the image installs {package}: apt-get install {package} here too"
                    self.packages.append(package)
            elif words[:2] == ["rm", "-rf"]:
                for target in words[2:]:
                    for path in glob.glob(str(self.path(target))):
                        shutil.rmtree(path)
            elif words[:2] == ["ln", "-s"]:
                target, link = words[2:]
                self.path(link).parent.mkdir(parents=True, exist_ok=True)
                self.path(link).symlink_to(self.path(target))
            elif words[0] == "useradd":
                self.home = words[words.index("--home-dir") + 1]
                self.users[words[-1]] = int(words[words.index("--uid") + 1])
                if "--create-home" in words or "-m" in words:  # useradd would make it the user's: not replayed
                    pytest.fail("the test does not replay a home made by useradd (it would be the user's)")
            elif words[0] == "mkdir":
                mode = int(words[words.index("-m") + 1], 8) if "-m" in words else 0o755
                for target in (word for word in words[1:] if word.startswith("/")):
                    self.path(target).mkdir(parents=True, exist_ok="-p" in words)
                    self.path(target).chmod(mode)  # whatever the umask, as mkdir -m
            elif words[0] == "printf" and words[-2] == ">":
                output = subprocess.run(["printf", *words[1:-2]], capture_output=True, check=True).stdout
                self.path(words[-1]).write_bytes(output)
            elif words[0] == "find":
                # Of the base image's files (not replayed): every setuid and setgid file of its root file system
                # loses those bits.
                assert words == ["find", "/", "-xdev", "-type", "f", "-perm", "/6000", "-exec", "chmod", "a-s", "{}",
                                 "+"], words
                self.setuid_stripped = True
            else:
                pytest.fail(f"the test does not know how to replay RUN {command!r}: teach it")

    def _user(self, arguments):
        self.user = arguments

    def _expose(self, arguments):
        self.exposed += arguments.split()

    def _healthcheck(self, arguments):
        _options, separator, command = arguments.partition(" CMD ")
        assert separator, "HEALTHCHECK without CMD"
        self.healthcheck = json.loads(command) if command.startswith("[") else ["/bin/sh", "-c", command]

    def conf_d(self) -> dict[str, str]:
        """The [scrapyd] options of the image's /etc/scrapyd/conf.d, which Scrapyd reads after scrapyd.conf."""
        parser = ConfigParser(interpolation=None)
        parser.read(sorted(self.path("/etc/scrapyd/conf.d").glob("*")))
        return dict(parser["scrapyd"])

    def _entrypoint(self, arguments):
        self.entrypoint = json.loads(arguments)  # exec form: the process gets docker stop's SIGTERM itself

    def _cmd(self, arguments):
        self.cmd = json.loads(arguments)


@pytest.fixture
def image(tmp_path) -> ImageReplay:
    return ImageReplay(tmp_path / "image").replay(dockerfile_instructions())


# --- tests -----------------------------------------------------------------------------------------------------


def test_image_installs_the_package_and_bakes_in_the_example_project(image):
    assert image.base == "python:3.11-slim"
    assert image.installed
    assert image.exposed == ["6800"]
    assert image.cmd[0] == "scrapyd"
    # PID 1 is tini (Debian's), which reaps orphaned processes (test_the_image_s_entry_point_reaps_...).
    assert image.entrypoint == ["tini", "-s", "--"] and "tini" in image.packages
    # Scrapyd's configuration is where Scrapyd reads it, and it is the repository's scrapyd.cfg.
    assert image.path("/etc/scrapyd/scrapyd.conf").read_text() == (REPOSITORY / "scrapyd.cfg").read_text()
    # Scrapy finds the baked-in project in /etc/scrapy.cfg; the project is importable from PYTHONPATH.
    scrapy_cfg = ConfigParser(interpolation=None)
    scrapy_cfg.read(image.path("/etc/scrapy.cfg"))
    module = scrapy_cfg.get("settings", "example")
    package_dirs = [image.path(p) for p in image.env["PYTHONPATH"].split(os.pathsep)]
    assert any((d / module.replace(".", "/")).with_suffix(".py").is_file() for d in package_dirs)
    # The database URL is never baked in.
    assert "SCRAPYD_DATABASE_URL" not in image.env
    scrapyd_conf = ConfigParser(interpolation=None)
    scrapyd_conf.read(image.path("/etc/scrapyd/scrapyd.conf"))
    assert not scrapyd_conf.has_option("scrapyd", "database_url")
    # Loopback by default, as stock Scrapyd; the image listens on its container's interfaces, where the node
    # insists on the API's username and password, which come from the environment, never the file.
    assert scrapyd_conf.get("scrapyd", "bind_address") == "127.0.0.1"
    assert image.env["SCRAPYD_BIND_ADDRESS"] == "0.0.0.0"
    assert not scrapyd_conf.has_option("scrapyd", "password")


def test_the_image_starts_as_root_so_that_crawls_get_users_of_their_own_and_the_node_drops_to_scrapyd(image):
    """Root by default: the node's spawner switches users (crawl_users is on by default and the image does not turn
    it off), the node drops to the image's own user, named in conf.d; root creates in the working directory without
    DAC_OVERRIDE (root's, 0755), where neither that user nor a crawl may add anything."""
    assert image.user == "root"
    assert image.conf_d() == {"node_user": "scrapyd"}
    assert image.users == {"scrapyd": 1000}
    for conf in (image.path("/etc/scrapyd/scrapyd.conf"), *image.path("/etc/scrapyd/conf.d").glob("*")):
        parser = ConfigParser(interpolation=None)
        parser.read(conf)
        assert parser.get("scrapyd", "crawl_users", fallback="on") == "on", conf
    assert image.home == image.workdir == "/home/scrapyd", "the node's directories are relative to it"
    workdir = image.path(image.workdir).stat()
    assert (workdir.st_uid, stat.S_IMODE(workdir.st_mode)) == (0, 0o755)
    assert image.setuid_stripped, "no setuid program for a crawl's user to run"


def test_the_health_check_is_isolated_from_the_working_directory_and_pythonpath(image, tmp_path):
    """Root runs the HEALTHCHECK in the node's working directory: ``python -I`` puts neither it, nor PYTHONPATH (the
    baked-in projects) nor a user site on sys.path. ``python -m scrapyd_pgqueue.cli`` is the scrapyd-pgqueue command."""
    assert image.healthcheck == ["python", "-I", "-m", "scrapyd_pgqueue.cli", "health"]
    planted = tmp_path / "planted"
    (planted / "scrapyd_pgqueue" / "cli").mkdir(parents=True)
    for package in ("scrapyd_pgqueue", "scrapyd_pgqueue/cli"):
        (planted / package / "__init__.py").write_text("raise SystemExit('planted code ran')\n")
    (planted / "scrapyd_pgqueue" / "cli" / "__main__.py").write_text("raise SystemExit('planted code ran')\n")
    env = {**os.environ, "PYTHONPATH": str(planted), "SCRAPYD_HTTP_PORT": str(free_port())}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    for cwd in (planted, image.path(image.workdir)):
        result = subprocess.run(image.healthcheck, cwd=cwd, env=env, capture_output=True, text=True, timeout=30,
                                check=False)
        assert result.returncode == 1 and "planted" not in result.stderr, result.stderr  # the real one: no node
        assert "scrapyd-pgqueue health: alive.json:" in result.stderr
    result = subprocess.run(["python", "-m", "scrapyd_pgqueue.cli", "health"], cwd=planted, env=env,
                            capture_output=True, text=True, timeout=30, check=False)
    assert "planted code ran" in result.stderr, "the control: without -I, the planted package is imported"


def run_healthcheck(image: ImageReplay, env: dict[str, str], wrapper: list[str] = ()) -> int:
    return subprocess.run([*wrapper, *image.healthcheck], env=env, cwd=image.path(image.workdir),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False).returncode


def lay_out_node(image: ImageReplay, database_url: str, config: dict[str, str] | None = None,
                 python_path: list[str] = (), **environment: str) -> tuple[Path, dict[str, str], str]:
    """(working directory, environment, URL) of a node run from the replayed image as a container runs it, with
    ``config`` over the image's conf.d options."""
    workdir = image.path(image.workdir)
    home = image.path(image.home)
    # Files a test cannot write under /etc, put where the same program reads them with the same effect:
    # Scrapyd reads ./scrapyd.conf as it would /etc/scrapyd/scrapyd.conf, then ~/.scrapyd.conf as it would the files
    # of /etc/scrapyd/conf.d, and Scrapy ~/.scrapy.cfg as it would /etc/scrapy.cfg. (Not ./scrapy.cfg: Scrapyd would
    # read that one too, and it does not read the image's /etc/scrapy.cfg.) The image's conf.d names its user, whom the
    # image's /etc/passwd knows; here, by the uid useradd gave it.
    (workdir / "scrapyd.conf").symlink_to(image.path("/etc/scrapyd/scrapyd.conf"))
    (home / ".scrapy.cfg").symlink_to(image.path("/etc/scrapy.cfg"))
    conf_d = ConfigParser(interpolation=None)
    conf_d["scrapyd"] = image.conf_d()
    user = conf_d["scrapyd"]["node_user"]
    conf_d["scrapyd"]["node_user"] = str(image.users.get(user, user))
    conf_d["scrapyd"].update(config or {})
    with open(home / ".scrapyd.conf", "w") as file:
        conf_d.write(file)

    port = free_port()
    env = {key: os.environ[key] for key in ("LANG", "LC_ALL", "TZ") if key in os.environ}
    # The image's Python is the first on PATH; here, this test's.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")])
    env.update(image.env)
    env["PYTHONPATH"] = os.pathsep.join([*(str(image.path(p)) for p in image.env["PYTHONPATH"].split(os.pathsep)),
                                         *python_path])
    env["HOME"] = str(home)
    # What `docker run -e ...` / compose gives the container; the bind address keeps this test on loopback.
    env.update(SCRAPYD_DATABASE_URL=database_url, SCRAPYD_HTTP_PORT=str(port), SCRAPYD_BIND_ADDRESS="127.0.0.1",
               **environment)
    return workdir, env, f"http://127.0.0.1:{port}/"


def wait_until_healthy(image: ImageReplay, env: dict[str, str], node: subprocess.Popen, log: Path,
                       wrapper: list[str] = ()) -> None:
    deadline = time.monotonic() + 60
    while run_healthcheck(image, env, wrapper) != 0:
        assert node.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the HEALTHCHECK command never passed"
        time.sleep(0.5)


def schedule_and_wait(url: str, **fields: str) -> str:
    """The job id of a crawl scheduled through schedule.json, once listjobs.json lists it as finished."""
    data = urllib.parse.urlencode({"project": "example", **fields}).encode()
    with urllib.request.urlopen(f"{url}schedule.json", data=data, timeout=60) as response:
        answer = json.load(response)
    assert answer["status"] == "ok", answer
    job = answer["jobid"]

    def finished() -> bool:
        with urllib.request.urlopen(f"{url}listjobs.json", timeout=30) as response:
            return job in {j["id"] for j in json.load(response)["finished"]}

    wait_for(finished, 60, "the crawl to finish")
    return job


# The tests below run the node as this machine's root (every capability) in a directory only root may reach, on the
# tests' interpreter (which may be under root's home): crawls as the node's user. The image's own start, root with
# five capabilities dropping to its user, is test_the_image_s_node_...
AS_THE_NODE_S_USER = {"crawl_users": "off"}


def test_a_node_laid_out_like_the_image_is_healthy_and_crawls_the_baked_in_project(image, database_url, tmp_path):
    workdir, env, url = lay_out_node(image, database_url, AS_THE_NODE_S_USER)
    assert run_healthcheck(image, env) != 0, "healthy before the node even started"
    with open(tmp_path / "scrapyd.log", "wb") as log:
        node = subprocess.Popen(image.command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_until_healthy(image, env, node, tmp_path / "scrapyd.log")
        job = schedule_and_wait(url, spider="quotes")
        crawl_log = (workdir / "logs" / "example" / "quotes" / f"{job}.log").read_text()
        assert "'item_scraped_count': 5" in crawl_log
    finally:
        node.send_signal(signal.SIGTERM)  # docker stop
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()  # docker stop's SIGKILL after its grace period; the assertion below reports it
            node.wait(10)
    # tini passes the signal on; twistd shuts down, then exits by the signal it received, which tini reports.
    assert node.returncode == 128 + signal.SIGTERM
    assert "Server Shut Down." in (tmp_path / "scrapyd.log").read_text()
    assert run_healthcheck(image, env) != 0, "healthy after the node stopped"


def in_own_pid_namespace(command: list[str]) -> list[str]:
    """``command`` as PID 1 of a new PID namespace with its own /proc, as in a container (a user namespace too where
    this test does not run as root)."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--pid", "--fork", "--mount-proc", *command]


def process_table() -> dict[int, tuple[int, str, list[str]]]:
    """Every process this machine shows: pid -> (parent pid, state, its pids from its PID namespace outwards)."""
    table = {}
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in Path(status).read_text().splitlines() if ":\t" in line)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        table[int(fields["Pid"])] = (int(fields["PPid"]), fields["State"][0], fields["NSpid"].split())
    return table


def descendants(table, ancestor: int) -> set[int]:
    found, frontier = set(), {ancestor}
    while frontier:
        frontier = {pid for pid, (parent, _, _) in table.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize("entry_point", ["the image's", "none (control)"])
def test_the_image_s_entry_point_reaps_a_crawl_s_orphaned_grandchild(image, database_url, tmp_path, entry_point):
    """The image's command (ENTRYPOINT and CMD, read from the Dockerfile) as PID 1 of its own PID namespace, as in a
    container; a crawl starts a grandchild that outlives it (the sleeper's ``orphan=1``, a double fork). Once the
    crawl has ended, no zombie is left: tini reaps it. The control runs the CMD alone (the same command minus tini,
    scrapyd as PID 1) and finds the orphan a zombie: the check sees what it looks for."""
    command = image.command if entry_point == "the image's" else image.cmd
    records = tmp_path / "records"
    records.mkdir()  # where the sleeper records its orphan: a path crawls may write (Landlock's crawl_paths)
    workdir, env, url = lay_out_node(image, database_url, {**AS_THE_NODE_S_USER, "crawl_paths": str(records)},
                                     EXAMPLE_RECORD_DIR=str(records))
    log = tmp_path / "scrapyd.log"
    with open(log, "wb") as output:
        unshare = subprocess.Popen(in_own_pid_namespace(command), cwd=workdir, env=env, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # PID 1 of the namespace: unshare's one child, once it has become the command.
        init = int(wait_for(lambda: (Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
                                     or [None])[0], 10, "the namespace's first process"))
        wait_for(lambda: Path(f"/proc/{init}/comm").read_text().strip() == command[0], 10, f"PID 1 to be {command[0]}")
        wait_until_healthy(image, env, unshare, log)
        job = schedule_and_wait(url, spider="sleeper", orphan="1")
        [orphan] = [json.loads(line)["pid"] for line in (records / "orphans.jsonl").read_text().splitlines()
                    if json.loads(line)["job"] == job]

        def orphan_state() -> str | None:
            """The orphan's state ("Z": a zombie), None once reaped; it is a process of the namespace, its
            (host pid, namespace pid) among PID 1's descendants."""
            table = process_table()
            return next((table[pid][1] for pid in descendants(table, init) if table[pid][2][-1] == str(orphan)),
                        None)

        def zombies() -> list[int]:
            table = process_table()
            return [pid for pid in descendants(table, init) if table[pid][1] == "Z"]

        if entry_point == "the image's":
            wait_for(lambda: orphan_state() is None and not zombies(), 30, "the crawl's orphan to end and be reaped")
        else:
            wait_for(lambda: orphan_state() == "Z", 30, "the crawl's orphan to end")
            table = process_table()
            zombie = next(pid for pid in descendants(table, init) if table[pid][2][-1] == str(orphan))
            assert table[zombie][0] == init  # scrapyd, PID 1, never waits for it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(unshare.pid, signal.SIGKILL)  # the namespace's PID 1 and so every process in it
        unshare.wait(30)


@pytest.fixture
def image_others_may_reach() -> Iterator[ImageReplay]:
    """The image replayed where every user may pass (mode 0711 on the way), as crawls under their projects' uids
    read the image's Python and projects."""
    directory = Path(tempfile.mkdtemp(prefix="image-"))
    directory.chmod(0o711)
    try:
        yield ImageReplay(directory).replay(dockerfile_instructions())
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def ids_and_capabilities(pid: int) -> tuple[int, int, int]:
    """(real uid, real gid, effective capabilities) of a process."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), int(fields["CapEff"], 16)


CAPABILITY_BITS = {"CHOWN": 0, "FOWNER": 3, "KILL": 5, "SETGID": 6, "SETUID": 7}


def test_the_image_s_node_as_root_with_five_capabilities_drops_to_its_user_and_runs_crawls_as_their_project_s(
        image_others_may_reach, database_url, tmp_path):
    """The node as the image starts it in Compose and the chart: root, with no capability but the five Compose adds
    (--bounding-set, as Docker's cap_drop/cap_add) and no new privileges, in the image's working directory (root's,
    0755). Its spawner keeps root and those; the node runs as the image's user with none; each crawl runs under its
    project's uid; the directories root made without DAC_OVERRIDE are root's, the project's and the node's, and the
    node serves the crawls' logs. Two crawls of one project: the second reopens what the first made."""
    image = image_others_may_reach
    capabilities = compose_file(SECRETS)["services"]["scrapyd"]["cap_add"]
    container = ["setpriv", "--bounding-set", ",".join(["-all", *(f"+{name.lower()}" for name in capabilities)]),
                 "--inh-caps", "-all", "--no-new-privs", "--"]
    # The image's scrapyd runs /usr/local/bin/python, which every user may read; the tests' interpreter may be under
    # root's home: the system's, on the tests' libraries (as tests/test_crawl_users.py).
    command = [part for word in image.command for part in ([SYSTEM_PYTHON, "-m", "scrapyd"] if word == "scrapyd"
                                                           else [word])]
    workdir, env, url = lay_out_node(image, database_url, python_path=[str(REPOSITORY), *site.getsitepackages()])
    node_uid = image.users["scrapyd"]
    log = tmp_path / "scrapyd.log"
    with open(log, "wb") as output:
        node = subprocess.Popen([*container, *command], cwd=workdir, env=env, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until_healthy(image, env, node, log, wrapper=container)  # Docker runs the check in the container too
        [scrapyd] = children_of(node.pid)  # tini's one child
        [spawner] = wait_for(lambda: children_of(scrapyd, b"scrapyd_pgqueue.node.spawner"), 30, "the spawner")
        assert ids_and_capabilities(spawner) == (0, 0, sum(1 << CAPABILITY_BITS[name] for name in capabilities))
        assert ids_and_capabilities(scrapyd) == (node_uid, node_uid, 0)
        with urllib.request.urlopen(f"{url}daemonstatus.json", timeout=30) as response:
            assert json.load(response)["crawl_boundary"] == ["separate users", "landlock"]

        crawl_logs = [workdir / "logs" / "example" / "quotes" / f"{schedule_and_wait(url, spider='quotes')}.log"
                      for _ in range(2)]
        for crawl_log in crawl_logs:
            assert "'item_scraped_count': 5" in crawl_log.read_text()
            # The node, as its own user, reads the log a crawl wrote (the node's group): it serves it.
            with urllib.request.urlopen(f"{url}logs/example/quotes/{crawl_log.name}", timeout=30) as response:
                assert "'item_scraped_count': 5" in response.read().decode()
        project_uid = crawl_logs[0].stat().st_uid
        assert 20000 <= project_uid <= 29999 and crawl_logs[1].stat().st_uid == project_uid

        def owner_and_mode(path: Path) -> tuple[int, int, int]:
            info = path.stat()
            return info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)

        assert owner_and_mode(workdir) == (0, 0, 0o755)
        for base in ("logs", "crawls"):  # root's, the node's group reads them, crawls only pass through
            assert owner_and_mode(workdir / base) == (0, node_uid, 0o751)
        assert owner_and_mode(workdir / "logs" / "example") == (project_uid, node_uid, 0o2770)
        assert owner_and_mode(workdir / "crawls" / "example") == (project_uid, project_uid, 0o700)
        for own in ("eggs", "dbs", "crawl-api"):  # the node's own, made by root before it dropped to its user
            assert owner_and_mode(workdir / own)[:2] == (node_uid, node_uid), own
        assert owner_and_mode(workdir / "eggs")[2] == owner_and_mode(workdir / "dbs")[2] == 0o700
    finally:
        node.send_signal(signal.SIGTERM)  # docker stop
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(10)
    assert node.returncode == 128 + signal.SIGTERM, log.read_text()[-3000:]
    assert "Server Shut Down." in log.read_text()


def interpolate(text: str, environment: dict[str, str]) -> str:
    """Compose's variable substitution: ${NAME}, ${NAME:-default}, ${NAME:?error}."""

    def substitute(match):
        name, operator, argument = match.groups()
        value = environment.get(name, "")
        if not value and operator == ":?":
            raise LookupError(f"{name}: {argument}")
        return value or (argument if operator == ":-" else "")

    return re.sub(r"\$\{(\w+)(?:(:[?-])([^}]*))?\}", substitute, text)


SECRETS = {"POSTGRES_PASSWORD": "owner-s3cret", "SCRAPYD_NODE_PASSWORD": "node-s3cret", "SCRAPYD_USERNAME": "operator",
           "SCRAPYD_PASSWORD": "api-s3cret"}


def compose_file(environment: dict[str, str]) -> dict:
    return yaml.safe_load(interpolate(COMPOSE_FILE.read_text(), environment))


def test_compose_runs_scalable_nodes_on_one_postgres_behind_one_address(image):
    # `docker compose config` needs the compose plugin, absent here: read the file as compose would.
    for missing in SECRETS:  # no default for any secret: each must come from the environment (or .env)
        with pytest.raises(LookupError, match=missing):
            compose_file({name: value for name, value in SECRETS.items() if name != missing})
    compose = compose_file(SECRETS)
    services = compose["services"]

    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:16")
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    volume = postgres["volumes"][0].split(":")[0]
    assert volume in compose["volumes"], "the database lives in a named volume"
    assert postgres["environment"]["POSTGRES_PASSWORD"] == SECRETS["POSTGRES_PASSWORD"]

    scrapyd = services["scrapyd"]
    assert scrapyd["build"] == "."
    assert "container_name" not in scrapyd and "ports" not in scrapyd, "fixed names or host ports prevent --scale"
    assert "healthcheck" not in scrapyd, "the image's own health check (isolated: python -I)"
    # Root in the container, so that crawls run under their projects' users; only the spawner's five capabilities, no
    # privilege gained by exec, a read-only image; the working directory root's (mode 0755, as the image's) and /tmp.
    assert scrapyd["user"] == "root"
    assert scrapyd["cap_drop"] == ["ALL"]
    assert sorted(scrapyd["cap_add"]) == ["CHOWN", "FOWNER", "KILL", "SETGID", "SETUID"]
    assert "no-new-privileges:true" in scrapyd["security_opt"]
    assert scrapyd["read_only"] is True
    tmpfs = dict(mount.split(":", 1) for mount in scrapyd["tmpfs"])
    assert set(tmpfs) == {"/tmp", image.home} and image.home == image.workdir
    assert "mode=0755" in tmpfs[image.home].split(",") and "mode=1777" in tmpfs["/tmp"].split(",")
    # The migration runs no spider: the image's user, no capability at all.
    assert (services["migrate"]["user"], services["migrate"]["cap_drop"]) == ("scrapyd", ["ALL"])
    assert "cap_add" not in services["migrate"] and services["migrate"]["read_only"] is True
    assert "init" not in scrapyd, "the image's entry point is the init (tini): Docker's would be a second"
    # Every image pinned to a version: untagged or :latest, a pull could bring another one.
    images = [service["image"] for service in services.values() if "image" in service]
    assert len(images) == len(services) - 2  # all but the two built from the Dockerfile (scrapyd, migrate)
    assert all(image_pinned(image) for image in images), images
    # Statements through PgBouncer in transaction mode, the one listener straight to Postgres.
    pgbouncer = services["pgbouncer"]
    assert pgbouncer["environment"]["POOL_MODE"] == "transaction"
    # A session's SET or temporary table is discarded after every transaction, not left for the next client.
    assert (pgbouncer["environment"]["SERVER_RESET_QUERY"], pgbouncer["environment"]["SERVER_RESET_QUERY_ALWAYS"]) == (
        devdb.SERVER_RESET_QUERY, "1")
    assert "options" not in pgbouncer["environment"].get("IGNORE_STARTUP_PARAMETERS", "")
    upstream = urllib.parse.urlsplit(pgbouncer["environment"]["DATABASE_URL"])
    assert (upstream.hostname, upstream.port) == ("postgres", 5432)
    database = urllib.parse.urlsplit(scrapyd["environment"]["SCRAPYD_DATABASE_URL"])
    assert (database.hostname, database.port) == ("pgbouncer", int(pgbouncer["environment"]["LISTEN_PORT"]))
    listen = urllib.parse.urlsplit(scrapyd["environment"]["SCRAPYD_LISTEN_URL"])
    assert (listen.hostname, listen.port) == ("postgres", 5432)
    # Nodes and PgBouncer connect as the node role, never as the image's bootstrap superuser.
    for url in (upstream, database, listen):
        assert (url.username, url.password) == ("scrapyd_node", SECRETS["SCRAPYD_NODE_PASSWORD"])
        assert url.path == "/" + postgres["environment"]["POSTGRES_DB"]
    assert SECRETS["POSTGRES_PASSWORD"] not in json.dumps([scrapyd, pgbouncer])
    # The API requires the username and password (the image refuses to listen beyond loopback without them).
    assert scrapyd["environment"]["SCRAPYD_USERNAME"] == SECRETS["SCRAPYD_USERNAME"]
    assert scrapyd["environment"]["SCRAPYD_PASSWORD"] == SECRETS["SCRAPYD_PASSWORD"]

    # A one-shot service creates the schema and the node role as the owner; nodes and PgBouncer wait for it.
    migrate = services["migrate"]
    assert migrate["build"] == "." and migrate["restart"] == "no"
    assert migrate["command"] == ["scrapyd-pgqueue", "grant", "scrapyd_node"]
    owner = urllib.parse.urlsplit(migrate["environment"]["SCRAPYD_DATABASE_URL"])
    assert (owner.username, owner.password) == (postgres["environment"]["POSTGRES_USER"], SECRETS["POSTGRES_PASSWORD"])
    assert (owner.hostname, owner.port) == ("postgres", 5432)
    assert migrate["environment"]["SCRAPYD_NODE_PASSWORD"] == SECRETS["SCRAPYD_NODE_PASSWORD"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for service in (scrapyd, pgbouncer):
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"

    # No secret on any command line: every command, entrypoint and health check is free of them.
    for name, service in services.items():
        argv = json.dumps([service.get(key) for key in ("command", "entrypoint")] + [service.get("healthcheck")])
        assert not [secret for secret in SECRETS.values() if secret in argv], name

    # One published address, spread over every replica that Docker's DNS knows by the service's name.
    (balancer,) = [s for name, s in services.items() if s.get("ports")]
    assert balancer["ports"] == ["127.0.0.1:6800:6800"], "the host's loopback only, unless the operator says"
    published = compose_file({**SECRETS, "SCRAPYD_PUBLISH_ADDRESS": "192.0.2.10"})["services"]["loadbalancer"]
    assert published["ports"] == ["192.0.2.10:6800:6800"]
    mount, target = balancer["volumes"][0].split(":")[:2]
    assert target == "/etc/nginx/nginx.conf"
    nginx = (REPOSITORY / mount).read_text()
    assert "listen 6800;" in nginx
    assert "resolver 127.0.0.11" in nginx, "Docker's DNS, asked again as replicas come and go"
    assert "set $scrapyd http://scrapyd:6800;" in nginx and "proxy_pass $scrapyd;" in nginx
