# One Scrapyd node of a scrapyd_pgqueue cluster, with the example project baked in.
#
#   docker build -t scrapyd-pgqueue .
#   docker run --env-file node.env -p 127.0.0.1:6800:6800 scrapyd-pgqueue
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

# A user of its own; its home is the working directory, where the relative logs/, eggs/ and dbs/ go.
RUN useradd --uid 1000 --create-home --home-dir /home/scrapyd --shell /usr/sbin/nologin scrapyd
USER scrapyd
WORKDIR /home/scrapyd

# Every interface of the container (Docker publishes the port); the node then insists on a username and password.
ENV SCRAPYD_BIND_ADDRESS=0.0.0.0
EXPOSE 6800
# Liveness: the node's process serves requests (alive.json, answered without touching the database). Not readiness
# (`scrapyd-pgqueue health --ready`: daemonstatus.json, ok only when the node reaches the database): an unhealthy
# container gets restarted by orchestrators, and a database stall must not restart healthy nodes and kill their crawls.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 CMD scrapyd-pgqueue health
ENTRYPOINT ["tini", "-s", "--"]
# No pid file: a container restarted with a stale twistd.pid would refuse to start.
CMD ["scrapyd", "--pidfile="]
