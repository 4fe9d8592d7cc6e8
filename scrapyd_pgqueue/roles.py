"""Database roles: the node role, with exactly the rights a node uses, and the start-up check of a node's own role.

Whatever a deployed egg runs can read its node's environment and configuration, the database URL included: the
rights of the role the nodes connect as are what a hostile spider gets. A node reads and writes the queue's rows,
takes ids from their sequences and calls the queue's functions; it needs no DDL, no ownership and no superuser
(a superuser's ``COPY ... TO PROGRAM`` is a shell on the database host).

The queue's objects are those the migrating role (the owner of the version table) has in that table's schema:
``grant`` gives the node role DML on its tables (SELECT only on the version table), USAGE on its sequences and
EXECUTE on its functions, and the same by default on what that owner creates there later (new migrations).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg2.extensions
from psycopg2 import sql

from scrapyd_pgqueue import db
from scrapyd_pgqueue.pool import Engine
from scrapyd_pgqueue.sql import text

NODE_PASSWORD_VARIABLE = "SCRAPYD_NODE_PASSWORD"
TABLE_RIGHTS = "SELECT, INSERT, UPDATE, DELETE"
# Predefined roles that read or write the server's files or run its programs (COPY ... TO PROGRAM).
SERVER_ACCESS_ROLES = ("pg_execute_server_program", "pg_read_server_files", "pg_write_server_files")


class RoleError(db.DatabaseError):
    """The node role cannot be set up as asked."""


# The schema holding the queue and the role that migrated it (owner of the version table): names and oids.
QUEUE_SCHEMA = text(f"""
    SELECT n.nspname, r.rolname, n.oid, r.oid
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace JOIN pg_roles AS r ON r.oid = c.relowner
    WHERE c.oid = to_regclass('{db.VERSION_TABLE}')
""")

# The queue's objects: (kind, name as SQL, is the version table), names quoted by the catalog (regclass and
# regprocedure print quoted, schema-qualified where the search path needs it).
QUEUE_OBJECTS = text(f"""
    SELECT CASE WHEN c.relkind = 'S' THEN 'sequence' ELSE 'table' END, c.oid::regclass::text,
           c.oid = to_regclass('{db.VERSION_TABLE}')
    FROM pg_class AS c
    WHERE c.relnamespace = :schema AND c.relowner = :owner AND c.relkind IN ('r', 'p', 'S')
    UNION ALL
    SELECT 'function', p.oid::regprocedure::text, false
    FROM pg_proc AS p
    WHERE p.pronamespace = :schema AND p.proowner = :owner AND p.prokind = 'f'
    ORDER BY 1, 2
""")

# What a role may do beyond a node's needs, in the queue's schema; the current user's when :role is null.
ROLE_FACTS = text(f"""
    SELECT r.rolname,
           EXISTS (SELECT FROM pg_roles AS s WHERE s.rolsuper AND pg_has_role(r.oid, s.oid, 'MEMBER')),
           r.rolcreaterole,
           array(SELECT s FROM unnest(CAST(:server_roles AS text[])) AS s WHERE pg_has_role(r.oid, s, 'MEMBER')),
           pg_has_role(r.oid, n.nspowner, 'MEMBER')
           OR EXISTS (SELECT FROM pg_class AS c WHERE c.relnamespace = n.oid AND pg_has_role(r.oid, c.relowner, 'MEMBER')),
           has_schema_privilege(r.oid, n.oid, 'CREATE')
    FROM pg_roles AS r, pg_namespace AS n
    WHERE r.rolname = coalesce(:role, current_user)
      AND n.oid = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('{db.VERSION_TABLE}'))
""")


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
    row = connection.execute(ROLE_FACTS, {"role": role, "server_roles": list(SERVER_ACCESS_ROLES)}).fetchone()
    return None if row is None else RoleFacts(*row)


def grant_node_role(engine: Engine, role: str, password: str | None = None) -> list[str]:
    """Create ``role`` (LOGIN, nothing else) if it does not exist, set its password if one is given, and give it
    exactly a node's rights on the queue; idempotent. Returns what the role may still do beyond them (rights it
    gets from PUBLIC or elsewhere). Refuses a role that is a superuser or owns the queue."""
    with db.operation(engine), db.transaction(engine) as connection:
        located = connection.execute(QUEUE_SCHEMA).fetchone()
        if located is None:
            raise RoleError(f"database at {db.describe(engine.url)} has no queue schema: run `scrapyd-pgqueue migrate`")
        schema, owner, schema_oid, owner_oid = located
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
        _grant(connection, run, role, (schema, schema_oid), (owner, owner_oid))
        return role_facts(connection, role).risks()


def _grant(connection, run, role: str, schema: tuple[str, int], owner: tuple[str, int]) -> None:
    grantee, schema_name, owner_name = sql.Identifier(role), sql.Identifier(schema[0]), sql.Identifier(owner[0])
    database = connection.execute(text("SELECT current_database()")).scalar()
    run(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), grantee))
    run(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema_name, grantee))
    objects = connection.execute(QUEUE_OBJECTS, {"schema": schema[1], "owner": owner[1]}).fetchall()
    for kind, name, is_version_table in objects:
        target = sql.SQL(name)  # printed by the catalog, quoted as needed
        if kind == "function":
            run(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(target, grantee))
            continue
        # Exactly these rights: whatever was granted before (ALL, TRUNCATE, TRIGGER, REFERENCES) goes.
        run(sql.SQL("REVOKE ALL ON {} {} FROM {}").format(sql.SQL(kind.upper()), target, grantee))
        rights = "USAGE" if kind == "sequence" else "SELECT" if is_version_table else TABLE_RIGHTS
        run(sql.SQL("GRANT {} ON {} {} TO {}").format(sql.SQL(rights), sql.SQL(kind.upper()), target, grantee))
    # Objects of later migrations, made by the same owner, get the same rights.
    for rights, kind in ((TABLE_RIGHTS, "TABLES"), ("USAGE", "SEQUENCES"), ("EXECUTE", "FUNCTIONS")):
        run(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT {} ON {} TO {}").format(
            owner_name, schema_name, sql.SQL(rights), sql.SQL(kind), grantee))


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
            "the nodes that role's URL (README, Security).", risks="; ".join(found),
        )
