-- The database functions of scrapyd_pgqueue as the newest migration leaves them, with the reasons for each step
-- beside it. The migrations create and change them (a migration never changes once released); this file is where a
-- reader starts, and where the next change to one of them starts: copy the function into the new migration, change
-- it there and here. tests/test_schema.py fails when this file and the migrated database disagree (it compares the
-- functions' arguments, results, volatility, language, settings and bodies, comments and spacing aside).
-- Tables and indexes: scrapyd_pgqueue/migrations/models.py.
--
-- Every function runs with its search path pinned (0010; 0008 for scrapyd_pgqueue_wanted_nodes): the schema the
-- migration ran in (public here), then pg_temp, last. Without it a function resolves the names in its body with its
-- caller's search path, where pg_temp comes first unless named: a session's TEMP TABLE spider_job would be read (and
-- written) instead of the queue's, and the claim would hand out a forged job.


-- How many jobs of one spider run in the cluster now (0004). VOLATILE on purpose: a volatile function takes a fresh
-- snapshot for each query it runs, so the claim, which calls it just after locking the spider's limit row, counts
-- the claims other nodes committed while it waited for that lock (its own snapshot, taken before, would miss them).
CREATE OR REPLACE FUNCTION spider_job_running(p_project text, p_spider text)
 RETURNS integer
 LANGUAGE sql
 SET search_path TO 'public', 'pg_temp'
AS $function$
        SELECT count(*)::integer FROM spider_job
        WHERE status = 'ongoing' AND project = p_project AND spider = p_spider
    $function$;


-- The claim (0006; 0007 stamps start_time with the database's clock; 0009 adds the first statement and plans once;
-- 0014 claims by pool): the next p_limit pending jobs of p_projects (all when NULL) that a node with tags p_tags may
-- run (each job's pool, its required tags joined, a subset of them) move to 'ongoing' for node p_node (process
-- p_worker), in one round trip. The store calls it (store/queue.py, CLAIM_NEXT_JOBS). Each step is shaped for concurrency, and for
-- a cost that does not grow with the backlog.
--
-- Why a function, planned once: planning a claim costs more than running it (0.2-0.4 ms against 0.1-0.2 ms on
-- spider_job's indexes). PL/pgSQL keeps each static statement's plan in the server connection (which works behind
-- PgBouncer's transaction pooling, unlike prepared statements), and force_generic_plan keeps the plan cache from
-- planning again for each call's values. What needs its values to be planned well is EXECUTEd, so planned with
-- them: several projects (a generic plan cannot know that they are a small part of the backlog, and would read the
-- whole pending index for them) and the limits.
-- Each statement of a VOLATILE function takes a fresh snapshot, so jobs promoted by one step are claimable by the
-- next (in the same call), and a limited spider's running jobs are counted after its limit row is locked. The rows
-- are held only for this call. The rows returned: the jobs claimed, then a summary row (id NULL: how many delayed
-- jobs became due, and in how many seconds the next one is; the poller sets its timer by it), except when the first
-- statement filled every slot: its rows carry the next due time themselves.
CREATE OR REPLACE FUNCTION claim_spider_jobs(p_projects text[], p_limit integer, p_node text, p_worker text, p_channel text, p_tags text[] DEFAULT NULL::text[])
 RETURNS TABLE(id bigint, project text, job text, attempts integer, message jsonb, priority double precision, waited double precision, promoted bigint, next_due_in double precision)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET lock_timeout TO '15s'
 SET search_path TO 'public', 'pg_temp'
AS $function$
    #variable_conflict use_column
    DECLARE
        v_tagged boolean;
        v_hot boolean := p_limit > 0 AND coalesce(cardinality(p_projects) = 1, false)
                         AND coalesce(cardinality(p_tags), 0) = 0;
        v_claimed bigint := 0;
        v_round integer;
        v_promoted bigint := 0;
        v_next_due timestamptz;
        v_limited boolean;
        v_pools text[];
        v_projects text := CASE WHEN p_projects IS NULL THEN 'true'
                                WHEN cardinality(p_projects) = 1 THEN 'project = $1[1]'
                                ELSE 'project = ANY($1)' END;
        v_unlimited text;
        v_next text;
    BEGIN
        -- One project (ISpiderQueue.pop, a node with one project) on a node without tags, the hot path: one
        -- statement, nothing read before it. It claims only when no limit applies to the project and none of its
        -- delayed jobs is due (two probes of small indexes, evaluated once, in the same statement): then claim order
        -- is the pending index's. The head of pool '' (jobs that require no tag: the only ones a node without tags
        -- may run) of that project in spider_job_pending_project_idx, in (pool, project, priority DESC, id) order:
        -- the pool is an equality on the index's first column, so a node without tags never reads a tagged job.
        -- The project is a range from itself to itself, not an equality: this plan is made once for any project,
        -- and with = its estimate is the average project's, for which reading spider_job_pending_idx and passing
        -- over other projects' jobs looks as cheap (a small project behind a big one would read the big one's
        -- backlog on every claim); only spider_job_pending_project_idx gives rows in this order. FOR UPDATE SKIP
        -- LOCKED: concurrent claimers pass over each other's rows instead of queueing behind them; LIMIT = the
        -- caller's free slots (a node never takes more than it can start); id = ANY(ARRAY(...)) updates the locked
        -- rows through the primary key, whatever LIMIT is. start_time is the database's clock (0007), like every
        -- time the nodes compare. Each row carries the next due time (the head of spider_job_delayed_project_idx).
        -- Slots filled: the call ends here.
        IF v_hot THEN
            RETURN QUERY
            UPDATE spider_job AS j
            SET status = 'ongoing', node = p_node, worker = p_worker, start_time = now(), attempts = j.attempts + 1
            WHERE j.id = ANY(ARRAY(
                  SELECT n.id FROM spider_job AS n
                  WHERE n.status = 'pending' AND n.pool = ''
                    AND n.project >= p_projects[1] AND n.project <= p_projects[1]
                    AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = p_projects[1])
                    AND NOT EXISTS (SELECT FROM spider_job AS d
                                    WHERE d.status = 'delayed' AND d.project = p_projects[1] AND d.run_at <= now())
                  ORDER BY n.pool, n.project, n.priority DESC, n.id LIMIT p_limit FOR UPDATE SKIP LOCKED))
            RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                      CAST(extract(epoch FROM now() - j.run_at) AS double precision), 0::bigint,
                      CAST(extract(epoch FROM (
                          SELECT d.run_at FROM spider_job AS d WHERE d.status = 'delayed' AND d.project = p_projects[1]
                          ORDER BY d.run_at LIMIT 1) - now()) AS double precision);
            GET DIAGNOSTICS v_claimed = ROW_COUNT;
            IF v_claimed = p_limit THEN
                RETURN;
            END IF;
        END IF;

        -- The next due time (the head of spider_job_delayed_idx, or of each project in
        -- spider_job_delayed_project_idx: a project without delayed jobs reads nothing of the others'), and whether
        -- a limit applies. When a delayed job is due: due delayed jobs become pending and wake the nodes (at most
        -- 1,000 a call, the earliest first), read from the head of spider_job_delayed_idx (a million jobs still
        -- waiting cost nothing), and the next due time is read again for the summary.
        FOR v_round IN 1..2 LOOP
            SELECT CASE WHEN p_projects IS NULL THEN (
                       SELECT min(d.run_at) FROM spider_job AS d WHERE d.status = 'delayed'
                   ) ELSE (
                       SELECT min(due.run_at) FROM unnest(p_projects) AS wanted(project), LATERAL (
                           SELECT d.run_at FROM spider_job AS d
                           WHERE d.status = 'delayed' AND d.project = wanted.project
                           ORDER BY d.run_at LIMIT 1
                       ) AS due
                   ) END,
                   EXISTS (SELECT FROM spider_limit AS l WHERE p_projects IS NULL OR l.project = ANY(p_projects))
            INTO v_next_due, v_limited;
            EXIT WHEN v_round = 2 OR v_next_due IS NULL OR v_next_due > now();
            WITH promoted AS (
                UPDATE spider_job AS j SET status = 'pending'
                WHERE j.id = ANY(ARRAY(
                    SELECT d.id FROM spider_job AS d
                    WHERE d.status = 'delayed' AND d.run_at <= now()
                      AND (p_projects IS NULL OR d.project = ANY(p_projects))
                    ORDER BY d.run_at
                    LIMIT 1000
                    FOR UPDATE SKIP LOCKED))
                RETURNING j.project
            ), woken AS (
                SELECT count(*) AS jobs, pg_notify(p_channel, promoted.project) FROM promoted GROUP BY promoted.project
            )
            SELECT coalesce(sum(woken.jobs), 0) INTO v_promoted FROM woken;
        END LOOP;

        IF p_limit <= v_claimed OR NOT (v_limited OR v_promoted > 0 OR NOT v_hot) THEN
            NULL;
        ELSE
            -- The pools this node may claim from: every pending pool whose tags it all has (a skip scan of
            -- spider_job_pending_idx's first column, one probe per pool: a few). A node without tags: pool '' only.
            -- Set here, not where declared: the hot path's calls evaluate no more than 0009's did.
            v_tagged := coalesce(cardinality(p_tags), 0) > 0;
            IF v_tagged THEN
                v_pools := ARRAY(SELECT pending.pool FROM spider_job_pending_pools() AS pending(pool)
                                 WHERE string_to_array(pending.pool, ',') <@ p_tags);
            ELSE
                v_pools := ARRAY[''];
            END IF;
            v_unlimited := CASE WHEN v_limited THEN 'AND NOT EXISTS (SELECT FROM spider_limit AS l '
                                                    'WHERE l.project = j.project AND l.spider = j.spider)'
                                ELSE '' END;
            -- The next jobs this node may run, best first (a fixed fragment chooses the projects, the values are
            -- parameters). Without tags: the head of pool '' in spider_job_pending_idx (all projects) or
            -- spider_job_pending_project_idx (one project; several projects: spider_job_pending_idx from its head,
            -- other projects' jobs passed over). With tags: the head of each of its pools, each an index range of
            -- its own (the free slots and 32 more from each, unlocked), merged by priority, then locked in that
            -- order with SKIP LOCKED until the free slots are filled (LockRows under LIMIT: no row beyond them is
            -- locked, so no other claimer passes over a job this one does not take). Priority and FIFO order hold
            -- across the pools, and no job the node cannot run is ever read. c.status = 'pending' is rechecked on
            -- a row another claimer changed since this statement's snapshot: a job claimed meanwhile is skipped.
            -- The 32 cover the rows concurrent claimers hold at the head of a pool; with more, a claim may come
            -- back short, and the next one (a tick, a NOTIFY) takes the rest.
            v_next := CASE WHEN NOT v_tagged THEN format($next$
                SELECT id, priority FROM spider_job AS j WHERE status = 'pending' AND pool = '' AND %1$s %2$s
                ORDER BY priority DESC, id LIMIT $2 FOR UPDATE SKIP LOCKED
                $next$, v_projects, v_unlimited)
            ELSE format($next$
                SELECT c.id, c.priority FROM spider_job AS c
                WHERE c.status = 'pending' AND c.id = ANY(ARRAY(
                    SELECT head.id FROM unnest($5) AS runnable(pool), LATERAL (
                        SELECT id FROM spider_job AS j
                        WHERE status = 'pending' AND j.pool = runnable.pool AND %1$s %2$s
                        ORDER BY priority DESC, id LIMIT $2 + 32
                    ) AS head))
                ORDER BY c.priority DESC, c.id LIMIT $2 FOR UPDATE OF c SKIP LOCKED
                $next$, v_projects, v_unlimited) END;
            -- Some spider has a limit (spider_limit): that spider is filled by one claimer at a time, the one that
            -- locked its limit row (SKIP LOCKED: the others claim other spiders' jobs meanwhile, no head-of-line
            -- blocking); spider_job_running() counts its running jobs after that lock, in a fresh snapshot, so
            -- claims committed by other nodes meanwhile are counted: never more than max_running at once. Each
            -- limited spider reads the head of spider_job_pending_spider_idx, at most its free room, passing over
            -- the jobs of pools this node may not run; the other spiders' jobs are the next jobs above.
            IF v_limited THEN
                RETURN QUERY EXECUTE format($claim$
                    WITH limits AS MATERIALIZED (
                        SELECT project, spider, max_running FROM spider_limit WHERE %1$s
                        FOR UPDATE SKIP LOCKED
                    ), room AS (
                        SELECT project, spider, max_running - spider_job_running(project, spider) AS free FROM limits
                    ), unlimited_jobs AS (
                        %2$s
                    ), limited_jobs AS (
                        SELECT next.id, next.priority FROM room, LATERAL (
                            SELECT id, priority FROM spider_job
                            WHERE status = 'pending' AND project = room.project AND spider = room.spider
                              AND pool = ANY($5)
                            ORDER BY priority DESC, id
                            LIMIT greatest(least(room.free, $2), 0)
                            FOR UPDATE SKIP LOCKED
                        ) AS next
                    ), next_jobs AS (
                        SELECT id FROM (SELECT * FROM unlimited_jobs UNION ALL SELECT * FROM limited_jobs) AS candidates
                        ORDER BY priority DESC, id
                        LIMIT $2
                    )
                    UPDATE spider_job AS j
                    SET status = 'ongoing', node = $3, worker = $4, start_time = now(), attempts = j.attempts + 1
                    FROM next_jobs WHERE j.id = next_jobs.id
                    RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                              CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                              NULL::double precision
                $claim$, v_projects, v_next)
                USING p_projects, CAST(p_limit - v_claimed AS integer), p_node, p_worker, v_pools;
            -- No limit: the next jobs above. After the first statement, only jobs that just became due are left
            -- to claim.
            ELSE
                RETURN QUERY EXECUTE format($claim$
                    UPDATE spider_job AS j
                    SET status = 'ongoing', node = $3, worker = $4, start_time = now(), attempts = j.attempts + 1
                    WHERE j.id = ANY(ARRAY(SELECT next.id FROM (%1$s) AS next))
                    RETURNING j.id, j.project, j.job, j.attempts, j.message, j.priority,
                              CAST(extract(epoch FROM now() - j.run_at) AS double precision), NULL::bigint,
                              NULL::double precision
                $claim$, v_next)
                USING p_projects, CAST(p_limit - v_claimed AS integer), p_node, p_worker, v_pools;
            END IF;
        END IF;

        -- The summary row: how many became due, and in how many seconds the next delayed job is due.
        RETURN QUERY
        SELECT NULL::bigint, NULL::text, NULL::text, NULL::integer, NULL::jsonb, NULL::double precision,
               NULL::double precision, v_promoted, CAST(extract(epoch FROM v_next_due - now()) AS double precision);
    END
    $function$;


-- A crawl tree's open jobs (0005; 0007 creates the completion job at now()), counted in the same transaction as
-- every change that opens or ends one: a child's insert, a final state (finish, recovery, hand-back, cancel), a
-- requeue, a delete of a waiting job. One trigger covers every way a job ends, including those written later; its
-- WHEN clause keeps jobs outside trees at no cost (no function call). The update of the tree's row serialises the last
-- two jobs ending at the same instant on two nodes: only the one that brings the count to zero sees zero, and it
-- enqueues the _on_complete job in its own transaction (exactly once: completion_job is set with it; never for a
-- cancelled tree) and notifies scrapyd_pgqueue_trees with the root. That same ending writes a tree_done event for each
-- webhook that wants one (0012), in the same transaction: an outbox row, delivered by any node (store/webhooks.py).
-- The triggers: migration 0005.
CREATE OR REPLACE FUNCTION spider_tree_count()
 RETURNS trigger
 LANGUAGE plpgsql
 SET search_path TO 'public', 'pg_temp'
AS $function$
    DECLARE
        delta integer;
        opened integer := 0;
        tree spider_tree;
        completion text;
    BEGIN
        IF TG_OP = 'INSERT' THEN
            delta := 1;
            opened := 1;
        ELSIF TG_OP = 'DELETE' THEN
            delta := -1;
        ELSE
            delta := CASE WHEN NEW.status = 'terminated' THEN -1 ELSE 1 END;
        END IF;
        UPDATE spider_tree
        SET open_jobs = open_jobs + delta, total = total + opened,
            done_time = CASE WHEN open_jobs + delta = 0 THEN now() END
        WHERE root_id = coalesce(NEW.tree_id, OLD.tree_id)
        RETURNING * INTO tree;
        IF tree.open_jobs = 0 THEN
            IF tree.on_complete IS NOT NULL AND tree.completion_job IS NULL AND NOT tree.cancelled THEN
                completion := replace(CAST(gen_random_uuid() AS text), '-', '');
                -- Its pool (0014): its spider's route, else '' (any node), as for a job scheduled without _tags.
                INSERT INTO spider_job (project, spider, job, priority, message, status, run_at, created_time, pool)
                VALUES (tree.project, tree.on_complete->>'spider', completion, 0,
                        coalesce(tree.on_complete->'args', '{}'::jsonb)
                            || jsonb_build_object('name', tree.on_complete->>'spider', '_job', completion,
                                                  'settings', '{}'::jsonb, 'tree', tree.root_job),
                        'pending', now(), now(), coalesce((SELECT r.pool FROM spider_route AS r
                            WHERE r.project = tree.project AND r.spider = tree.on_complete->>'spider'), ''));
                UPDATE spider_tree SET completion_job = completion WHERE root_id = tree.root_id;
                tree.completion_job := completion;
                PERFORM pg_notify('scrapyd_pgqueue_jobs', tree.project);
            END IF;
            PERFORM pg_notify('scrapyd_pgqueue_trees', CAST(json_build_object(
                'project', tree.project, 'root', tree.root_job, 'root_id', tree.root_id) AS text));
            INSERT INTO webhook_event (webhook_id, event, fields)
            SELECT w.id, 'tree_done', jsonb_build_object(
                       'project', tree.project, 'root', tree.root_job, 'root_id', tree.root_id, 'jobs', tree.total,
                       'cancelled', tree.cancelled, 'completion_job', tree.completion_job,
                       'start_time', tree.created_time, 'end_time', tree.done_time)
            FROM webhook AS w
            WHERE 'tree_done' = ANY(w.events) AND (w.project IS NULL OR w.project = tree.project);
        END IF;
        RETURN NULL;
    END $function$;


-- How many nodes the queue wants (0008): the work nodes could run now, divided by the slots of one node (its
-- max_proc), rounded up; what an autoscaler asks (KEDA's postgresql trigger: SELECT scrapyd_pgqueue_wanted_nodes(4)
-- with targetQueryValue 1) and /metrics shows. 0 when there is nothing to do, so a cluster scaled to zero wakes
-- on the first job. SECURITY DEFINER with the search path of its creation (0008 sets it to the queue's schema, then
-- pg_temp: a caller's temporary table is never read instead): a scaler's role needs EXECUTE on it only, never a
-- right to read jobs; it only reads. EXECUTE is not PUBLIC's (0008 revokes it): `scrapyd-pgqueue grant`
-- gives it to the node role. JIT off: the estimates of its capped counts would make Postgres compile them, at
-- 0.2-0.4 s a call, for reads of milliseconds.
CREATE OR REPLACE FUNCTION scrapyd_pgqueue_wanted_nodes(slots_per_node integer)
 RETURNS integer
 LANGUAGE plpgsql
 STABLE STRICT SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET jit = off
AS $function$
    DECLARE
        -- Waiting jobs are read up to 1,000 nodes' worth per kind, whatever the backlog: the answer is at most
        -- 1,000 nodes anyway, and the call stays cheap enough for every scrape and every scaler poll.
        v_cap bigint := 1000 * greatest(slots_per_node, 1);
        v_work bigint;
    BEGIN
        IF slots_per_node < 1 THEN
            RAISE EXCEPTION 'slots_per_node must be at least 1, not %', slots_per_node
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT
            -- Running jobs of spiders without a cluster-wide limit (a stopping node's too: their node is still
            -- needed until they end or are handed back).
            (SELECT count(*) FROM spider_job AS j
             WHERE j.status = 'ongoing'
               AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider))
            -- Their pending jobs (due: a delayed job becomes pending at its run_at).
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'pending'
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
            -- Delayed jobs whose time has come but that no node has promoted yet (with no node at all, nobody
            -- does): work now. Those still waiting for their time are not.
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'delayed' AND j.run_at <= now()
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
            -- A spider with a limit (spider_limit) runs at most max_running jobs at once in the cluster: its work
            -- is its running jobs and as many due ones as its limit leaves room for (its waiting excess needs no
            -- node); never less than what runs (a limit lowered under its running jobs).
          + (SELECT coalesce(sum(greatest(limited.running, least(l.max_running, limited.running + limited.waiting))), 0)
             FROM spider_limit AS l, LATERAL (
                SELECT (SELECT count(*) FROM spider_job AS j
                        WHERE j.status = 'ongoing' AND j.project = l.project AND j.spider = l.spider) AS running,
                       (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'pending' AND j.project = l.project AND j.spider = l.spider
                            LIMIT l.max_running) AS capped)
                     + (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'delayed' AND j.run_at <= now()
                              AND j.project = l.project AND j.spider = l.spider
                            LIMIT l.max_running) AS capped) AS waiting
             ) AS limited)
            -- Periodic jobs due to fire: firing takes a live node (scale from zero), one slot each.
          + (SELECT count(*) FROM (
                SELECT FROM periodic_job AS p WHERE NOT p.paused AND p.next_fire_time <= now() LIMIT v_cap) AS capped)
        INTO v_work;
        RETURN least(ceil(v_work::numeric / slots_per_node), 1000)::integer;
    END
    $function$;


-- How many nodes of one pool the queue wants (0014): the one-argument form's work, of the jobs a node with `tags`
-- may run only (each job's pool, its required tags joined, a subset of them; a periodic job's fired job goes to its
-- own pool, else its spider's route, else anywhere). What each pool's autoscaler asks (KEDA:
-- SELECT scrapyd_pgqueue_wanted_nodes(4, ARRAY['browser'])). Jobs that require no tag count in every pool: any node
-- may run them. The tag filter is row by row: a scaler's call, bounded by the same caps, not the claim.
CREATE OR REPLACE FUNCTION scrapyd_pgqueue_wanted_nodes(slots_per_node integer, tags text[])
 RETURNS integer
 LANGUAGE plpgsql
 STABLE STRICT SECURITY DEFINER
 SET search_path TO 'public', 'pg_temp'
 SET jit TO 'off'
AS $function$
    DECLARE
        v_cap bigint := 1000 * greatest(slots_per_node, 1);
        v_work bigint;
    BEGIN
        IF slots_per_node < 1 THEN
            RAISE EXCEPTION 'slots_per_node must be at least 1, not %', slots_per_node
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT
            (SELECT count(*) FROM spider_job AS j
             WHERE j.status = 'ongoing' AND string_to_array(j.pool, ',') <@ tags
               AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider))
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'pending' AND string_to_array(j.pool, ',') <@ tags
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
          + (SELECT count(*) FROM (
                SELECT FROM spider_job AS j
                WHERE j.status = 'delayed' AND j.run_at <= now() AND string_to_array(j.pool, ',') <@ tags
                  AND NOT EXISTS (SELECT FROM spider_limit AS l WHERE l.project = j.project AND l.spider = j.spider)
                LIMIT v_cap) AS capped)
          + (SELECT coalesce(sum(greatest(limited.running, least(l.max_running, limited.running + limited.waiting))), 0)
             FROM spider_limit AS l, LATERAL (
                SELECT (SELECT count(*) FROM spider_job AS j
                        WHERE j.status = 'ongoing' AND j.project = l.project AND j.spider = l.spider AND string_to_array(j.pool, ',') <@ tags) AS running,
                       (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'pending' AND j.project = l.project AND j.spider = l.spider AND string_to_array(j.pool, ',') <@ tags
                            LIMIT l.max_running) AS capped)
                     + (SELECT count(*) FROM (
                            SELECT FROM spider_job AS j
                            WHERE j.status = 'delayed' AND j.run_at <= now() AND string_to_array(j.pool, ',') <@ tags
                              AND j.project = l.project AND j.spider = l.spider AND string_to_array(j.pool, ',') <@ tags
                            LIMIT l.max_running) AS capped) AS waiting
             ) AS limited)
          + (SELECT count(*) FROM (
                SELECT FROM periodic_job AS p WHERE NOT p.paused AND p.next_fire_time <= now()
                  AND string_to_array(coalesce(p.pool, (SELECT r.pool FROM spider_route AS r
                      WHERE r.project = p.project AND r.spider = p.spider), ''), ',') <@ tags LIMIT v_cap) AS capped)
        INTO v_work;
        RETURN least(ceil(v_work::numeric / slots_per_node), 1000)::integer;
    END
    $function$;


-- The distinct pools of pending jobs (0014), by a skip scan of spider_job_pending_idx's first column: one index
-- probe per pool, whatever the backlog. A tagged node's claim, the listings in claim order and the unroutable counts
-- read it.
CREATE OR REPLACE FUNCTION spider_job_pending_pools()
 RETURNS SETOF text
 LANGUAGE sql
 STABLE
 SET search_path TO 'public', 'pg_temp'
AS $function$
        WITH RECURSIVE pools(pool) AS (
            (SELECT j.pool FROM spider_job AS j WHERE j.status = 'pending' ORDER BY j.pool LIMIT 1)
            UNION ALL
            SELECT (SELECT j.pool FROM spider_job AS j WHERE j.status = 'pending' AND j.pool > pools.pool
                    ORDER BY j.pool LIMIT 1)
            FROM pools WHERE pools.pool IS NOT NULL
        )
        SELECT pools.pool FROM pools WHERE pools.pool IS NOT NULL
    $function$;
