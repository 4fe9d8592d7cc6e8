# One Scrapyd node of a scrapyd_pgqueue cluster, with the example project baked in.
#
#   docker build -t scrapyd-pgqueue .
#   docker run -e SCRAPYD_DATABASE_URL=postgresql://user:password@host:5432/db -p 6800:6800 scrapyd-pgqueue
#
# docker-compose.yml runs any number of these on one Postgres, behind one address.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The package and its dependencies (psycopg2-binary brings its own libpq: no system packages needed).
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
RUN useradd --create-home --home-dir /home/scrapyd --shell /usr/sbin/nologin scrapyd
USER scrapyd
WORKDIR /home/scrapyd

EXPOSE 6800
# Healthy when the node answers and reaches the database (daemonstatus.json counts the queue).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD python -c "import json, os, urllib.request; port = os.environ.get('SCRAPYD_HTTP_PORT') or '6800'; answer = json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/daemonstatus.json', timeout=4)); raise SystemExit(answer['status'] != 'ok')"
# No pid file: a container restarted with a stale twistd.pid would refuse to start.
CMD ["scrapyd", "--pidfile="]
