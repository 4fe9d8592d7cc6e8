"""Local tooling, never used by a node: the ``scrapyd-pgqueue cluster`` command's processes (``cluster``) and the
throwaway Postgres it and the tests start (``devdb``)."""
