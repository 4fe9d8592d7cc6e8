"""A spider that does what a hostile egg could with its node's database URL, had it found it (crawls hold none: the
test hands it the URL in a file), and tries what a node's role must not do. It records, per attempt, "ok" or the
database's refusal, in <EXAMPLE_RECORD_DIR>/intrusions.jsonl.

Spider arguments: ``url_file``, the file holding the node's URL; ``marker``, a file that ``COPY ... TO PROGRAM`` would create on the database host;
``other_database``, a database of the same server whose ``secret`` table the spider tries to read.
"""

import urllib.parse

import psycopg2

from example.recording import RecordingSpider


class IntruderSpider(RecordingSpider):
    name = "intruder"

    async def start(self):
        with open(self.url_file) as f:
            url = f.read().strip()
        other = urllib.parse.urlsplit(url)._replace(path="/" + self.other_database).geturl()
        attempts = {
            "read_queue": (url, "SELECT count(*) FROM spider_job"),  # what a node does: must work
            "create_table": (url, "CREATE TABLE intruder (id int)"),
            "drop_queue": (url, "DROP TABLE spider_job"),
            "copy_to_program": (url, f"COPY (SELECT 1) TO PROGRAM 'touch {self.marker}'"),
            "read_other_database": (other, "SELECT * FROM secret"),
        }
        results = {name: self.attempt(*attempt) for name, attempt in attempts.items()}
        self.append_record(self.crawler.settings.get("EXAMPLE_RECORD_DIR"), "intrusions.jsonl",
                           {"job": self.job, "results": results})
        return
        yield

    @staticmethod
    def attempt(url, statement):
        """Run one statement in a transaction that is rolled back whatever happens: "ok", or why not."""
        try:
            connection = psycopg2.connect(url, connect_timeout=5)
        except psycopg2.Error as e:
            return f"no connection: {str(e).strip().splitlines()[0]}"
        try:
            with connection.cursor() as cursor:
                cursor.execute(statement)
            return "ok"
        except psycopg2.Error as e:
            return f"{e.pgcode}: {str(e).strip().splitlines()[0]}"
        finally:
            connection.rollback()
            connection.close()
