"""Database roles: the node role, with exactly the rights a node uses, and the start-up check of a node's own role.

Whatever a deployed egg runs may find its way to the database URL: the rights of the role the nodes connect as are
what a hostile spider gets. A node reads and writes the queue's rows, takes ids from their sequences and calls the
queue's functions; it needs no DDL, no ownership and no superuser (a superuser's ``COPY ... TO PROGRAM`` is a shell
on the database host).

``grant`` gives the node role rights on the queue's objects by name (``NODE_TABLES``, ``NODE_SEQUENCES``,
``NODE_FUNCTIONS``: the objects the migrations create, in the schema of the version table), none on anything else
the schema holds (it names those), and no default privileges on future tables (a new migration adds its objects to
the lists). It bounds what one session of the role can hold up (``RoleLimits``), and takes from PUBLIC what lets a
session shadow the queue's tables (TEMP on the database, CREATE on the schema) when it may, else says how.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import psycopg2.extensions
from psycopg2 import sql

from scrapyd_pgqueue.database import db
from scrapyd_pgqueue.database.connection_pool import STATEMENT_TIMEOUT_MS, Engine
from scrapyd_pgqueue.database.sql import text

NODE_PASSWORD_VARIABLE = "SCRAPYD_NODE_PASSWORD"
ROW_RIGHTS = "SELECT, INSERT, UPDATE, DELETE"
# The queue's objects as the migrations create them (tests/test_security.py checks them against a migrated
# database), and the node role's rights on each: the only objects grant gives rights on.
NODE_TABLES = {
    "spider_job": ROW_RIGHTS,
    # A big batch is copied in, then moved to spider_job and deleted, in one transaction; never updated.
    "spider_job_staging": "SELECT, INSERT, DELETE",
    "spider_job_maintenance": ROW_RIGHTS,
    "job_log": ROW_RIGHTS,
    "periodic_job": ROW_RIGHTS,
    "scrapyd_node": ROW_RIGHTS,
    "spider_limit": ROW_RIGHTS,
    "spider_route": ROW_RIGHTS,  # routes are read by every enqueue; the operator's command writes them
    "spider_tree": ROW_RIGHTS,
    "spider_tree_key": ROW_RIGHTS,
    "webhook": ROW_RIGHTS,  # the operator's hooks: nodes read them to deliver and count what they delivered
    "webhook_event": ROW_RIGHTS,  # the outbox: written with each event's cause, claimed and deleted by deliveries
    # A deploy inserts a new row (a new id) and deletes the old one; no node updates an egg or its digest in place.
    "project_egg": "SELECT, INSERT, DELETE",
    "project_user": "SELECT, INSERT",  # a project's uid is assigned once, then only read
    "project_egg_spiders": "SELECT, INSERT",  # an egg's spiders are listed once, then only read; gone with the egg
    "crawl_request": ROW_RIGHTS,  # the frontier's requests: stored, leased, done; deleted with their crawl
    "crawl_slot": ROW_RIGHTS,  # each download slot's next lease time (DOWNLOAD_DELAY); deleted with their crawl
    db.VERSION_TABLE: "SELECT",  # nodes check the schema's revision; only the owner migrates
}
NODE_SEQUENCES = ("crawl_request_id_seq", "project_egg_id_seq", "spider_job_id_seq", "spider_tree_root_id_seq", "webhook_event_id_seq",
                  "webhook_id_seq")  # USAGE: nextval
NODE_FUNCTIONS = (  # EXECUTE; as oidvectortypes() prints their arguments
    "claim_spider_jobs(text[], integer, text, text, text, text[])",
    "crawl_request_release()",
    "scrapyd_nodes_want_work()",
    "scrapyd_pgqueue_wanted_nodes(integer, integer)",
    "scrapyd_pgqueue_wanted_nodes(integer, text[], integer)",
    "spider_job_ended_events()",
    "spider_job_key_unless_taken(text, text)",
    "spider_job_pending_pools()",
    "spider_job_running(text, text)",
    "spider_job_stats_summary(jsonb)",
    "spider_job_unroutable_pools(double precision, bigint)",
    "spider_tree_count()",
)
# Predefined roles that read or write the server's files or run its programs (COPY ... TO PROGRAM).
SERVER_ACCESS_ROLES = ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files")
# Server connections left to roles that are not nodes when grant derives the node role's CONNECTION LIMIT from
# max_connections: the owner's migrate or grant, an operator's session, an autoscaler's query.
OTHER_ROLES_CONNECTIONS = 3


@dataclass(frozen=True)
class RoleLimits:
    """Role settings (ALTER ROLE ... SET) bounding what one session of the node role can hold up; seconds, 0: none.

    A node sends its own statement_timeout and lock_timeout with every statement
    (``connection_pool.STATEMENT_PREFIX``, 15 s), so these apply to what does not: the claim function (which sets
    only its lock_timeout), BEGIN/COMMIT, and any session that is not a node's. A session may SET them again: they
    bound the careless, not the determined (whom the node role's rights bound). A None is the default, set only
    when the role has no such setting yet (an operator's own value stays); a number is set."""

    lock_timeout: float | None = None  # default: above the 15 s a node's statements wait for a lock
    statement_timeout: float | None = None  # default: four times the 15 s any node statement is given
    # Default: a node's transactions are never idle for more than the Python time between two of its statements
    # (milliseconds); 10 s, below the 15 s a node waits for a lock, so a transaction left open holding a lock
    # (LOCK TABLE spider_job, then nothing) ends before the nodes' claims waiting behind it give up.
    idle_in_transaction_session_timeout: float | None = None
    connection_limit: int | None = None  # default: max_connections less the reserved and OTHER_ROLES_CONNECTIONS

    DEFAULTS = {"lock_timeout": STATEMENT_TIMEOUT_MS / 1000 + 5, "statement_timeout": 4 * STATEMENT_TIMEOUT_MS / 1000,
                "idle_in_transaction_session_timeout": 10.0}

    def settings(self) -> dict[str, tuple[str, bool]]:
        """Setting -> (value in milliseconds, given explicitly)."""
        return {name: (str(round(1000 * (self.DEFAULTS[name] if value is None else value))), value is not None)
                for name in self.DEFAULTS for value in [getattr(self, name)]}


@dataclass
class Granted:
    """What grant could not make right: ``risks``, the role's own (exit 1); ``warnings``, database-wide ones it
    may not change, each with the command that would (exit 0)."""

    risks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class RoleError(db.DatabaseError):
    """The node role cannot be set up as asked."""


# The schema holding the queue and the role that migrated it (owner of the version table), as QueueSchema.
QUEUE_SCHEMA = text("""
    SELECT n.nspname AS name, r.rolname AS owner, n.oid
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace JOIN pg_roles AS r ON r.oid = c.relowner
    WHERE c.oid = to_regclass(:version_table)
""")

# The objects of the queue's schema that are not the queue's (the lists above), and not an extension's: (kind, name,
# may the current user revoke rights on it (it owns it), may :role still use it (a right of PUBLIC or granted by
# another owner)).
OTHER_OBJECTS = text("""
    WITH objects AS (
        SELECT CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view' WHEN 'm' THEN 'materialized view'
                              WHEN 'f' THEN 'foreign table' ELSE 'table' END AS kind,
               c.relname::text AS name, c.relowner AS owner, 'pg_class'::regclass AS catalog, c.oid,
               CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(:role, c.oid, 'USAGE, SELECT, UPDATE')
                    ELSE has_table_privilege(:role, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE') END AS usable
        FROM pg_class AS c
        WHERE c.relnamespace = :schema AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'f')
        UNION ALL
        SELECT 'function', p.proname || '(' || oidvectortypes(p.proargtypes) || ')', p.proowner, 'pg_proc'::regclass,
               p.oid, has_function_privilege(:role, p.oid, 'EXECUTE')
        FROM pg_proc AS p
        WHERE p.pronamespace = :schema
    )
    SELECT o.kind, o.name, pg_has_role(o.owner, 'USAGE') AS revocable, o.usable
    FROM objects AS o
    WHERE NOT (o.kind = 'table' AND o.name = ANY(:tables) OR o.kind = 'sequence' AND o.name = ANY(:sequences)
               OR o.kind = 'function' AND o.name = ANY(:functions))
      AND NOT EXISTS (SELECT FROM pg_depend AS d WHERE d.classid = o.catalog AND d.objid = o.oid AND d.deptype = 'e')
    ORDER BY 1, 2
""")

# The role settings :role has already (those for every database), as ALTER ROLE ... SET left them.
ROLE_SETTINGS = text("""
    SELECT split_part(setting, '=', 1)
    FROM pg_db_role_setting AS s, unnest(s.setconfig) AS setting
    WHERE s.setrole = (SELECT oid FROM pg_roles WHERE rolname = :role) AND s.setdatabase = 0
""")

# What the current user may change: (role settings and limits of a non-superuser role, the database's rights).
ADMIN_FACTS = text("""
    SELECT r.rolsuper OR r.rolcreaterole AS may_alter, pg_has_role(d.datdba, 'USAGE') AS owns_database,
           d.datname AS database, (SELECT rolconnlimit FROM pg_roles WHERE rolname = :role) AS connection_limit,
           current_setting('max_connections')::integer - current_setting('superuser_reserved_connections')::integer
           - coalesce(current_setting('reserved_connections', true)::integer, 0) AS available
    FROM pg_roles AS r, pg_database AS d
    WHERE r.rolname = current_user AND d.datname = current_database()
""")

# Who holds CREATE on the queue's schema besides its owner: (does PUBLIC, may the current user revoke it).
SCHEMA_CREATE = text("""
    SELECT EXISTS (SELECT FROM aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) AS a
                   WHERE a.grantee = 0 AND a.privilege_type = 'CREATE') AS public_creates,
           pg_has_role(n.nspowner, 'USAGE') AS owns_schema
    FROM pg_namespace AS n WHERE n.oid = :schema
""")

# What a role may do beyond a node's needs, in the queue's schema (RoleFacts); the current user's when :role is null.
ROLE_FACTS = text("""
    SELECT r.rolname AS name,
           EXISTS (SELECT FROM pg_roles AS s WHERE s.rolsuper AND pg_has_role(r.oid, s.oid, 'MEMBER')) AS superuser,
           r.rolcreaterole AS createrole,
           array(SELECT s FROM unnest(CAST(:server_roles AS text[])) AS s WHERE pg_has_role(r.oid, s, 'MEMBER'))
             AS server_roles,
           pg_has_role(r.oid, n.nspowner, 'MEMBER')
           OR EXISTS (SELECT FROM pg_class AS c WHERE c.relnamespace = n.oid AND pg_has_role(r.oid, c.relowner, 'MEMBER'))
             AS owner,
           has_schema_privilege(r.oid, n.oid, 'CREATE') AS creates
    FROM pg_roles AS r, pg_namespace AS n
    WHERE r.rolname = coalesce(:role, current_user)
      AND n.oid = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass(:version_table))
""")


@dataclass(frozen=True)
class QueueSchema:
    """The schema holding the queue, and the role that migrated it (the owner of the version table)."""

    name: str
    owner: str
    oid: int


@dataclass(frozen=True)
class RoleFacts:
    name: str
    superuser: bool  # or a member of one
    createrole: bool
    server_roles: list[str]
    owner: bool  # of the queue's schema or of one of its tables
    creates: bool  # in the queue's schema

    def risks(self) -> list[str]:
        """What the role may do that a node must not: empty for a proper node role."""
        if self.superuser:
            return [f"'{self.name}' is a superuser (COPY ... TO PROGRAM runs shell commands on the database host)"]
        found = [f"'{self.name}' may create roles"] if self.createrole else []
        if self.server_roles:
            found.append(f"'{self.name}' is a member of {', '.join(self.server_roles)} (the database host's files "
                         "or programs)")
        if self.owner:
            found.append(f"'{self.name}' owns the queue's schema or tables (it may ALTER or DROP them)")
        elif self.creates:
            found.append(f"'{self.name}' may create objects in the queue's schema")
        return found


def role_facts(connection, role: str | None = None) -> RoleFacts | None:
    """The rights of ``role`` (default: the connection's own) that matter; None without such a role or a schema."""
    row = connection.execute(ROLE_FACTS, {"role": role, "server_roles": list(SERVER_ACCESS_ROLES),
                                          "version_table": db.VERSION_TABLE}).fetchone()
    return None if row is None else RoleFacts(**row._asdict())


def grant_node_role(engine: Engine, role: str, password: str | None = None,
                    limits: RoleLimits = RoleLimits()) -> Granted:
    """Create ``role`` (LOGIN, nothing else) if it does not exist, set its password if one is given, and give it
    exactly a node's rights on the queue, within ``limits``; idempotent. Returns what it could not make right.
    Refuses a role that is a superuser or owns the queue."""
    with db.operation(engine), db.transaction(engine) as connection:
        located = connection.execute(QUEUE_SCHEMA, {"version_table": db.VERSION_TABLE}).fetchone()
        if located is None:
            raise RoleError(f"database at {db.describe(engine.url)} has no queue schema: run `scrapyd-pgqueue migrate`")
        schema = QueueSchema(**located._asdict())
        raw = connection.driver_connection

        def run(statement: sql.Composable, params=None):
            connection.exec_driver_sql(statement.as_string(raw), params)

        exists = connection.execute(text("SELECT true FROM pg_roles WHERE rolname = :role"), {"role": role}).scalar()
        if exists:
            facts = role_facts(connection, role)
            if facts.superuser or facts.owner:
                raise RoleError(f"not a node role: {facts.risks()[0]}; choose a new role name")
        else:
            run(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        if password:
            # Hashed here, as psql's \password does: the statement (which the server may log) holds no password.
            verifier = psycopg2.extensions.encrypt_password(password, role, raw)
            run(sql.SQL("ALTER ROLE {} PASSWORD %s").format(sql.Identifier(role)), (verifier,))
        granted = Granted()
        _grant(connection, run, role, schema)
        granted.warnings += _other_objects(connection, run, role, schema)
        granted.warnings += _limit(connection, run, role, limits)
        granted.warnings += _no_shadowing(connection, run, role, schema)
        facts = role_facts(connection, role)
        granted.risks = dataclasses.replace(facts, creates=False).risks()  # CREATE: _no_shadowing's warning
        return granted


def _grant(connection, run, role: str, schema: QueueSchema) -> None:
    grantee, schema_name = sql.Identifier(role), sql.Identifier(schema.name)
    database = connection.execute(text("SELECT current_database()")).scalar()
    run(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), grantee))
    run(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema_name, grantee))
    # Exactly these rights: whatever was granted before (ALL, TRUNCATE, TRIGGER, REFERENCES, a column's) goes.
    for kind, names in (("TABLE", NODE_TABLES), ("SEQUENCE", NODE_SEQUENCES)):
        for name in names:
            target = sql.Identifier(schema.name, name)
            run(sql.SQL("REVOKE ALL ON {} {} FROM {}").format(sql.SQL(kind), target, grantee))
            rights = NODE_TABLES[name] if kind == "TABLE" else "USAGE"
            run(sql.SQL("GRANT {} ON {} {} TO {}").format(sql.SQL(rights), sql.SQL(kind), target, grantee))
    for function in NODE_FUNCTIONS:
        target = sql.SQL("{}.").format(schema_name) + sql.SQL(function)  # a fixed signature, not input
        run(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(target, grantee))
    # Earlier versions of grant gave rights by default on whatever the owner created in the schema later: gone.
    for kind in ("TABLES", "SEQUENCES", "FUNCTIONS"):
        run(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} REVOKE ALL ON {} FROM {}").format(
            sql.Identifier(schema.owner), schema_name, sql.SQL(kind), grantee))


def _other_objects(connection, run, role: str, schema: QueueSchema) -> list[str]:
    """Take the role's rights on the schema's objects that are not the queue's (an earlier grant gave them), where
    the current user may; name them all, and those the role may still use."""
    params = {"schema": schema.oid, "role": role, "tables": list(NODE_TABLES), "sequences": list(NODE_SEQUENCES),
              "functions": list(NODE_FUNCTIONS)}
    others = connection.execute(OTHER_OBJECTS, params).fetchall()
    if not others:
        return []
    for other in others:
        if other.revocable:
            target = (sql.SQL("FUNCTION {}.").format(sql.Identifier(schema.name)) + sql.SQL(other.name)
                      if other.kind == "function" else
                      sql.SQL("SEQUENCE {}" if other.kind == "sequence" else "TABLE {}").format(
                          sql.Identifier(schema.name, other.name)))
            run(sql.SQL("REVOKE ALL ON {} FROM {}").format(target, sql.Identifier(role)))
    still = [f"{schema.name}.{other.name}" for other in connection.execute(OTHER_OBJECTS, params) if other.usable]
    named = ", ".join(f"{schema.name}.{other.name} ({other.kind})" for other in others)
    warning = (f"schema {schema.name} holds objects that are not the queue's: {named}; '{role}' gets no right on "
               "them from grant, but keep the queue in a schema of its own")
    if still:
        warning += f" ('{role}' may still use {', '.join(still)}: rights of PUBLIC or of another owner)"
    return [warning]


def _limit(connection, run, role: str, limits: RoleLimits) -> list[str]:
    """Role settings and a connection limit: set where the current user may, else a warning naming the command."""
    admin = connection.execute(ADMIN_FACTS, {"role": role}).fetchone()
    present = set(connection.execute(ROLE_SETTINGS, {"role": role}).scalars())
    grantee = sql.Identifier(role)
    statements = [sql.SQL("ALTER ROLE {} SET {} = {}").format(grantee, sql.Identifier(name), sql.Literal(f"{ms}ms"))
                  for name, (ms, given) in limits.settings().items() if given or name not in present]
    if limits.connection_limit is not None or admin.connection_limit == -1:
        wanted = limits.connection_limit if limits.connection_limit is not None else max(
            admin.available - OTHER_ROLES_CONNECTIONS, 1)
        statements.append(sql.SQL("ALTER ROLE {} CONNECTION LIMIT {}").format(grantee, sql.Literal(wanted)))
    if admin.may_alter:
        for statement in statements:
            run(statement)
        return []
    if not statements:
        return []
    commands = "; ".join(statement.as_string(connection.driver_connection) for statement in statements)
    return [f"the role's limits were not set (that needs CREATEROLE or a superuser): run as one: {commands}"]


def _no_shadowing(connection, run, role: str, schema: QueueSchema) -> list[str]:
    """No temporary table (TEMP on the database) or new object (CREATE on the schema) for the role to shadow the
    queue's tables with: taken from PUBLIC and the role where the current user may, else a warning naming the
    command."""
    warnings = []
    admin = connection.execute(ADMIN_FACTS, {"role": role}).fetchone()
    grantee, schema_name = sql.Identifier(role), sql.Identifier(schema.name)
    database_name = sql.Identifier(admin.database)
    revoke_temp = sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(database_name)
    if admin.owns_database:
        run(revoke_temp)
        run(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM {}").format(database_name, grantee))
    if connection.execute(text("SELECT has_database_privilege(:role, current_database(), 'TEMPORARY')"),
                          {"role": role}).scalar():
        warnings.append(f"'{role}' may create temporary tables (a right of PUBLIC): run as the database's owner: "
                        f"{revoke_temp.as_string(connection.driver_connection)}")
    create = connection.execute(SCHEMA_CREATE, {"schema": schema.oid}).fetchone()
    revoke_create = sql.SQL("REVOKE CREATE ON SCHEMA {} FROM PUBLIC").format(schema_name)
    if create.owns_schema:
        run(sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(schema_name, grantee))
        if create.public_creates:  # Postgres 14 and older give it on schema public
            run(revoke_create)
    if connection.execute(text("SELECT has_schema_privilege(:role, CAST(:schema AS oid), 'CREATE')"),
                          {"role": role, "schema": schema.oid}).scalar():
        command = revoke_create.as_string(connection.driver_connection)
        warnings.append(f"'{role}' may create objects in the queue's schema (PUBLIC's right on schema public on "
                        f"Postgres 14 and older): run as the schema's owner: {command}")
    return warnings


_checked = False


def warn_if_privileged(engine: Engine) -> None:
    """Log once per process, at a node's start-up, what its database role may do beyond a node's needs. Advisory:
    a database that cannot answer now is the node's other checks' business."""
    global _checked
    if _checked:
        return
    try:
        with db.operation(engine), db.autocommit(engine) as connection:
            facts = role_facts(connection)
    except db.DatabaseError:
        return
    _checked = True
    found = facts.risks() if facts else []
    if found:
        from twisted.logger import Logger

        Logger(namespace="scrapyd_pgqueue").warn(
            "This node's database role has more rights than a node needs, and every deployed egg runs with them: "
            "{risks}. Fix: create a node role with `scrapyd-pgqueue grant ROLE` (as the schema's owner) and give "
            "the nodes that role's URL (docs/how-to/security.md).", risks="; ".join(found),
        )
