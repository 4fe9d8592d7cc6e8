# One Scrapyd node of a scrapyd_pgqueue cluster, with the example project baked in.
#
#   docker build -t scrapyd-pgqueue .
#   docker run --env-file node.env -p 127.0.0.1:6800:6800 --cap-drop ALL --cap-add SETUID --cap-add SETGID \
#     --cap-add CHOWN --cap-add FOWNER --cap-add KILL --security-opt no-new-privileges scrapyd-pgqueue
#
# It starts as root, and only so that it can give each project's crawls a user of their own: its spawner keeps root
# (with the capabilities above, and no others: SETUID and SETGID switch users, CHOWN and FOWNER give each project's
# directories to its user, KILL signals crawls of other users); the node itself drops to the user scrapyd before it
# serves anything, and crawls run under their project's uid (crawl_uid_range, README "Security").
#
# node.env (secrets in a file, never on a command line): SCRAPYD_DATABASE_URL=postgresql://node-role:...@host/db,
# SCRAPYD_USERNAME=... and SCRAPYD_PASSWORD=... The node listens on every interface of its container, so it refuses
# to start without the username and password; its database role should be a node role (`scrapyd-pgqueue grant`).
#
# docker-compose.yml runs any number of these on one Postgres, behind one address.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini, Debian's, is the entry point: PID 1 of the container, it reaps the processes crawls leave behind (a browser a
# spider started and never waited for, orphaned when its crawl ends), which scrapyd as PID 1 would keep as zombies,
# and passes docker stop's SIGTERM on to scrapyd. -s: it reaps as a subreaper too where it is not PID 1
# (docker run --init, a pod sharing its process namespace).
RUN apt-get update && apt-get install -y --no-install-recommends tini && rm -rf /var/lib/apt/lists/*

# The package and its dependencies (psycopg2-binary brings its own libpq: no other system package needed).
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scrapyd_pgqueue ./scrapyd_pgqueue
RUN pip install . && rm -rf /src

# Projects baked into the image are importable modules named in scrapyd.conf's [settings] section.
COPY example_project /opt/example_project
ENV PYTHONPATH=/opt/example_project

# Scrapyd reads /etc/scrapyd/scrapyd.conf; Scrapy (`scrapy list`, run by schedule.json) reads [settings] from
# /etc/scrapy.cfg. The database URL is not in the file: it comes from SCRAPYD_DATABASE_URL at run time.
COPY scrapyd.cfg /etc/scrapyd/scrapyd.conf
RUN ln -s /etc/scrapyd/scrapyd.conf /etc/scrapy.cfg

# The node's own user, scrapyd (uid 1000). The container starts as root: the node starts its spawner, which keeps
# root to start crawls under their projects' uids, then drops to node_user, written here explicitly (not left to the
# working directory's owner) into conf.d, which Scrapyd reads after scrapyd.conf. (The chart mounts its own conf.d
# over this one, and writes node_user there too.)
# The working directory /home/scrapyd belongs to root, mode 0755: root, without DAC_OVERRIDE, makes the node's
# directories in it (logs/, items/, jobs/ and crawls/ for the crawls; eggs/, dbs/ for the node, which it gives to
# scrapyd), and neither the node's user nor a crawl can add or replace anything there (a scrapyd.conf root would
# read at the next start). The home is never created by useradd, which would make it scrapyd's.
# No setuid or setgid programs: a crawl's user can gain nothing by running one (su, passwd, mount ...), whether or
# not the container runs with no-new-privileges.
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /home/scrapyd --shell /usr/sbin/nologin scrapyd \
    && mkdir -m 0755 /home/scrapyd \
    && mkdir -p /etc/scrapyd/conf.d \
    && printf '%s\n' '[scrapyd]' '# The image: the node drops to this user once its spawner runs (Dockerfile).' \
        'node_user = scrapyd' > /etc/scrapyd/conf.d/00-image.conf \
    && find / -xdev -type f -perm /6000 -exec chmod a-s {} +
USER root
WORKDIR /home/scrapyd

# Every interface of the container (Docker publishes the port); the node then insists on a username and password.
ENV SCRAPYD_BIND_ADDRESS=0.0.0.0
EXPOSE 6800
# Liveness: the node's process serves requests (alive.json, answered without touching the database). Not readiness
# (`scrapyd-pgqueue health --ready`: daemonstatus.json, ok only when the node reaches the database): an unhealthy
# container gets restarted by orchestrators, and a database stall must not restart healthy nodes and kill their crawls.
# Isolated (python -I): the check runs as root in the node's working directory, so nothing on its sys.path may come
# from there, from PYTHONPATH (the baked-in projects: spider code) or from a user site: only the installed package.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-I", "-m", "scrapyd_pgqueue.cli", "health"]
ENTRYPOINT ["tini", "-s", "--"]
# No pid file: a container restarted with a stale twistd.pid would refuse to start.
CMD ["scrapyd", "--pidfile="]
