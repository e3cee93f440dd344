//! The plans the hot path relies on, pinned at a million ready items beside a million scheduled
//! ones, a thousand tenants and ten thousand users:
//! every statement a claim or a status update runs is index probes, never a scan of the
//! backlog or of the users, and never a sort; so is the operators' user_work listing.

use fairway_server::config::ServeArgs;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use fairway_api::strategy::Strategy;
use fairway_broker::db::sql::Statement;
use fairway_broker::statements::{claims, counters, endings, jobs, maintenance, tenancy};

use crate::helpers::{fresh_database, spawn_app_with, TestApp};

const TENANTS: i32 = 1_000;
const USERS: i32 = 10_000;
const ITEMS: i32 = 1_000_000;

/// PostgreSQL's default `jit_above_cost`.
const JIT_ABOVE_COST: f64 = 100_000.0;

/// A thousand tenants (a tenth of them sharded over ten queriers), ten users each, two jobs per
/// user (one synchronous, half of those under a two-level actor path), each job with metadata
/// (`customer`: a thousand values, `mode`: two) and a priority, a million ready items dealt over
/// them and two components, a share of them finished, as many scheduled items beside them (a
/// hundredth of them due), and counters to match; then statistics, as autovacuum would leave
/// them.
const SEED: &str = "
INSERT INTO tenants (tenant, max_queriers, sharded)
SELECT 'tenant-' || t, CASE WHEN t % 10 = 0 THEN 3 ELSE 0 END, t % 10 = 0
  FROM generate_series(1, $TENANTS) t;
INSERT INTO queriers (querier) SELECT 'pod-' || q FROM generate_series(0, 9) q;
INSERT INTO tenant_shards (tenant, querier)
SELECT t.tenant, 'pod-' || ((hashtext(t.tenant) & 7) + k)
  FROM tenants t, generate_series(0, 2) k
 WHERE t.sharded;
INSERT INTO users (username) SELECT 'user-' || u FROM generate_series(1, $USERS) u;
INSERT INTO jobs (job_id, username, is_async, tenant, actor, priority)
SELECT md5('job-' || u || '-' || j)::uuid, 'user-' || u, j = 2, 'tenant-' || (u % $TENANTS + 1),
       CASE WHEN j = 2 AND u % 2 = 0 THEN ARRAY['dash-' || u % 7, 'panel-' || u % 3]
            ELSE '{}' END,
       hashtext(md5('job-' || u || '-' || j)) % 1000
  FROM generate_series(1, $USERS) u, generate_series(1, 2) j;
INSERT INTO job_steps (job_id, step_index, service, aggregate) SELECT job_id, 0, 'svc', false FROM jobs;
INSERT INTO user_work (job_id, step_index, component, username, service, is_async, tenant, actor)
SELECT j.job_id, 0, c.component, j.username, 'svc', j.is_async, j.tenant, j.actor
  FROM jobs j, (VALUES ('ingester'), ('store-gateway')) c(component);
INSERT INTO work_items (job_id, step_index, component, status, payload)
SELECT md5('job-' || (i % $USERS + 1) || '-' || (i % 2 + 1))::uuid, 0,
       CASE WHEN i % 3 = 0 THEN 'ingester' ELSE 'store-gateway' END,
       CASE WHEN i % 10 = 0 THEN 'successful' ELSE 'ready' END::work_item_status, '{}'
  FROM generate_series(1, $ITEMS) i;
INSERT INTO work_items (job_id, step_index, component, status, payload, not_before)
SELECT md5('job-' || (i % $USERS + 1) || '-' || (i % 2 + 1))::uuid, 0,
       CASE WHEN i % 3 = 0 THEN 'ingester' ELSE 'store-gateway' END, 'scheduled', '{}',
       now() + (i % 100 - 1) * interval '1 minute'
  FROM generate_series(1, $ITEMS) i;
INSERT INTO job_metadata (job_id, key, value)
SELECT job_id, 'customer', to_jsonb('customer-' || abs(hashtext(job_id::text)) % 1000) FROM jobs
UNION ALL
SELECT job_id, 'mode', to_jsonb(CASE WHEN hashtext(job_id::text) % 2 = 0 THEN 'a' ELSE 'b' END)
  FROM jobs;
INSERT INTO strategy_running (service, key, value) SELECT DISTINCT 'svc', key, value FROM job_metadata;
-- One update per row, with has_metadata: each row's new version then fits on its page, beside
-- the old one, and the table keeps the order it was written in.
UPDATE user_work uw
   SET ready_count = c.ready, successful_count = c.done, scheduled_count = c.scheduled,
       has_metadata = true
  FROM (SELECT job_id, component, count(*) FILTER (WHERE status = 'ready') AS ready,
               count(*) FILTER (WHERE status = 'successful') AS done,
               count(*) FILTER (WHERE status = 'scheduled') AS scheduled
          FROM work_items GROUP BY job_id, component) c
 WHERE (c.job_id, c.component) = (uw.job_id, uw.component);
INSERT INTO service_users (service, component, tenant, username, ready_count, local_ready)
SELECT 'svc', component, tenant, username, sum(ready_count),
       coalesce(sum(ready_count) FILTER (WHERE actor = '{}'), 0)
  FROM user_work GROUP BY component, tenant, username;
INSERT INTO actor_queues (service, component, tenant, username, path, parent, ready_count,
                          local_ready)
SELECT 'svc', component, tenant, username, actor[1:depth], actor[1:depth - 1],
       sum(ready_count), coalesce(sum(ready_count) FILTER (WHERE cardinality(actor) = depth), 0)
  FROM user_work, generate_series(1, cardinality(actor)) depth
 GROUP BY component, tenant, username, actor[1:depth], actor[1:depth - 1];
INSERT INTO tenant_queues (service, component, tenant)
SELECT DISTINCT service, component, tenant FROM service_users;
";

/// Every node of a JSON plan, depth first.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut all = vec![plan];
    for child in plan["Plans"].as_array().into_iter().flatten() {
        all.extend(nodes(child));
    }
    all
}

async fn plan(db: &tokio_postgres::Client, statement: &str, arguments: &str) -> Value {
    db.batch_execute("DEALLOCATE ALL").await.expect("deallocate");
    db.batch_execute(&format!("PREPARE pinned AS {statement}")).await.expect("prepare");
    let explain = format!("EXPLAIN (FORMAT JSON) EXECUTE pinned({arguments})");
    let row = db.query_one(&explain, &[]).await.expect("explain");
    let plan: Value = row.get(0);
    plan[0]["Plan"].clone()
}

/// Fails on any node that scans a whole table (but two small ones, below) or sorts, with
/// three exceptions, each bounded by something other than the backlog: with ten users per
/// tenant, the planner may read a tenant's few service_users rows by bitmap and sort them (a big
/// tenant gets the ordered index scan); a function may sort arrays (those it was given, and a
/// batch of attempt endings the owners of its items) and the rows its own updates returned; the
/// membership statements may sort the running items, one per busy worker, read from the leases
/// index; and a claim sorts the policies of its batch's services, to lock them in order. Bitmap scans are index reads of a key's rows. Each plan is also estimated below
/// PostgreSQL's default `jit_above_cost`, so that a server with JIT on (the default where it is
/// built in) never compiles one: compiling takes tens of milliseconds, a probe tens of
/// microseconds.
fn assert_index_probes(name: &str, plan: &Value) {
    let cost = plan["Total Cost"]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} has no estimated cost: {plan:#}"));
    assert!(cost < JIT_ABOVE_COST, "{name} is estimated at {cost}, past jit_above_cost: {plan:#}");
    for node in nodes(plan) {
        let kind = node["Node Type"].as_str().unwrap_or_default();
        // The per-pod queriers table is small, and so is service_policies, a row per service
        // an operator set a policy on, and fair_clocks, a row per queue claimed from; the logs
        // of running changes hold the changes since the last fold (a claim batch's, or the
        // upkeep's every second).
        let small = [
            "queriers",
            "service_policies",
            "fair_clocks",
            "tenant_running_changes",
            "strategy_running_changes",
        ];
        if !small.iter().any(|table| node["Relation Name"] == *table) {
            assert_ne!(kind, "Seq Scan", "{name} scans {}: {plan:#}", node["Relation Name"]);
        }
        // Exempt sorts read directly from one of those inputs: nothing above a LATERAL may sort.
        let sorts_small_input = node["Plans"].as_array().is_some_and(|inputs| {
            // A CTE's plan hangs below the node that reads it, as an InitPlan: what it reads
            // is checked on its own.
            let mut inputs =
                inputs.iter().filter(|input| input["Parent Relationship"] != "InitPlan");
            inputs.all(|input| {
                // Rows that come from no table: the arrays a function was given, and the rows a
                // batch's own updates returned (a batch of endings), read from its CTEs.
                nodes(input).iter().all(|below| below["Relation Name"].is_null())
                    || input["Index Name"] == "work_items_leases"
                    || input["Relation Name"] == "service_policies"
                    || (input["Node Type"] == "Bitmap Heap Scan"
                        && input["Relation Name"] == "service_users")
            })
        });
        if kind.contains("Sort") {
            assert!(sorts_small_input, "{name} sorts: {plan:#}");
        }
    }
}

/// Runs `batch` in a transaction that is rolled back, and returns the plan of every statement
/// it ran, those inside functions too, as auto_explain reports them to the session.
async fn nested_plans(
    db: &tokio_postgres::Client,
    notices: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    batch: &str,
) -> Vec<(String, Value)> {
    db.batch_execute(&format!("BEGIN; {batch}; ROLLBACK")).await.expect(batch);
    let mut plans = Vec::new();
    while let Ok(notice) = notices.try_recv() {
        let Some((_, json)) = notice.split_once("plan:") else { continue };
        let explained: Value = serde_json::from_str(json.trim()).expect("auto_explain JSON");
        let text = explained["Query Text"].as_str().unwrap_or_default().to_owned();
        plans.push((text, explained["Plan"].clone()));
    }
    plans
}

/// The plans of a batch of claims from pod-0 run after `setup` (in the same rolled-back
/// transaction, its own plan left out); fails unless one of them contains `marker`, the text of
/// the statement `what` names.
async fn claim_plans_after(
    db: &tokio_postgres::Client,
    notices: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    setup: &str,
    marker: &str,
    what: &str,
) -> Vec<(String, Value)> {
    let batch = format!("DO $$BEGIN {setup}; END$$; {}", claims("pod-0"));
    let plans: Vec<_> = nested_plans(db, notices, &batch)
        .await
        .into_iter()
        .filter(|(text, _)| text.trim() != setup)
        .collect();
    assert!(plans.iter().any(|(text, _)| text.contains(marker)), "no plan of {what}");
    plans
}

/// Has auto_explain report the plan of every statement the session runs, those inside
/// functions too, as a notice.
const AUTO_EXPLAIN: &str = "LOAD 'auto_explain';
     SET auto_explain.log_min_duration = 0;
     SET auto_explain.log_nested_statements = on;
     SET auto_explain.log_format = json;
     SET auto_explain.log_level = notice;";

/// A fresh database's connection, and a receiver of its notices (see AUTO_EXPLAIN).
async fn connect_with_notices(
) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let config = fresh_database().await;
    let (db, mut connection) = fairway_broker::db::pool::with_search_path(config.config())
        .connect(config.tls())
        .await
        .expect("connect");
    let (notice_sender, notices) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = futures_util::StreamExt::next(&mut messages).await {
            if let tokio_postgres::AsyncMessage::Notice(notice) = message {
                let _ = notice_sender.send(notice.message().to_owned());
            }
        }
    });
    (db, notices)
}

/// Ends the attempt `attempt` of item `item` successfully, as a batch of one that waits for
/// its owner's row: the reaper's way, and an ending's after its deferrals. The batches
/// that skip held owners are pinned by `finish_running`.
fn finish(item: i64, attempt: i32) -> String {
    format!(
        "SELECT * FROM finish_items(ARRAY[{item}::bigint], ARRAY[{attempt}], ARRAY['successful'], \
         ARRAY['[]'::jsonb], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY['\\x00'::bytea], \
         ARRAY[false], false, true)"
    )
}

/// Ends every running item in one batch, a third each successful, failed and retried, as
/// the claims before it in the same transaction left them; waiting for held owners or not.
fn finish_running(wait_for_owners: bool) -> String {
    format!(
        "SELECT * FROM finish_items(
             ARRAY(SELECT id FROM work_items WHERE status = 'running' ORDER BY id),
             ARRAY(SELECT attempt FROM work_items WHERE status = 'running' ORDER BY id),
             ARRAY(SELECT (ARRAY['successful', 'failed', 'ready'])[1 + id % 3]
                     FROM work_items WHERE status = 'running' ORDER BY id),
             ARRAY(SELECT '[]'::jsonb FROM work_items WHERE status = 'running' ORDER BY id),
             ARRAY(SELECT NULL::text FROM work_items WHERE status = 'running' ORDER BY id),
             ARRAY(SELECT NULL::text FROM work_items WHERE status = 'running' ORDER BY id),
             ARRAY(SELECT sha256(id::text::bytea)
                     FROM work_items WHERE status = 'running' ORDER BY id),
             ARRAY(SELECT false FROM work_items WHERE status = 'running' ORDER BY id),
             false, {wait_for_owners})"
    )
}

/// Leaves one tenant's queue of one component the only active one, as where a single tenant
/// has work: a setup step, not a statement of the claim's.
const ONE_TENANT_ACTIVE: &str = "UPDATE tenant_queues
    SET active = ((service, component, tenant) = ('svc', 'ingester', 'tenant-3'))";

/// Moves every user's counts past the copies in its queue rows, as claims in other services
/// leave them: a setup step, not a statement of the claim's.
const USERS_AHEAD_OF_THEIR_ROWS: &str = "UPDATE users SET running_count = running_count + 1";

/// Weighs, caps and rate-limits a tenth of the users, leaves another tenth out of the order with
/// buckets now due again, and caps and rate-limits every tenant: a setup step, one statement.
const USERS_AND_TENANTS_POLICED: &str = "WITH weighed AS (
        UPDATE users SET weight = 1 + length(username) % 8, max_running = 1000,
                         rate_per_second = 1000, burst = 100
         WHERE username LIKE '%1' RETURNING username, weight, max_running
    ), copied AS (
        UPDATE service_users su SET weight = w.weight, max_running = w.max_running
          FROM weighed w WHERE su.username = w.username
    ), due AS (
        UPDATE users SET throttled_until = now() - interval '1 second', rate_per_second = 1
         WHERE username LIKE '%2' RETURNING username
    ), left_out AS (
        UPDATE service_users su SET throttled = true FROM due WHERE su.username = due.username
    ), weighed_queues AS (
        UPDATE tenant_queues SET weight = 3
    )
    UPDATE tenants SET weight = 3, max_running = 1000000, rate_per_second = 1000, burst = 100";

/// Claims for 30 workers of `querier` in one batch.
fn claims(querier: &str) -> String {
    format!(
        "SELECT * FROM claim_items(array_fill('svc'::text, ARRAY[30]), \
         array_fill('{querier}'::text, ARRAY[30]), ARRAY(SELECT generate_series(0, 29)), \
         array_fill(1, ARRAY[30]), 300000, 1000, array_fill(NULL::jsonb, ARRAY[30]))"
    )
}

/// Claims for 30 workers of pod-0 in one batch, under `strategy` (as a worker sends it).
fn strategy_claims(strategy: &str) -> String {
    let attempts = Strategy::parse(strategy)
        .expect("a valid strategy")
        .to_claim_argument()
        .expect("not the plain fair order");
    format!(
        "SELECT * FROM claim_items(array_fill('svc'::text, ARRAY[30]), \
         array_fill('pod-0'::text, ARRAY[30]), ARRAY(SELECT generate_series(0, 29)), \
         array_fill(1, ARRAY[30]), 300000, 1000, array_fill('{attempts}'::jsonb, ARRAY[30]))"
    )
}

/// A fresh database seeded by SEED, with statistics; its connection reports plans (see
/// AUTO_EXPLAIN) once asked to.
async fn seeded(
    tenants: i32,
    users: i32,
    items: i32,
) -> (tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let (db, notices) = connect_with_notices().await;
    let seed = SEED
        .replace("$TENANTS", &tenants.to_string())
        .replace("$USERS", &users.to_string())
        .replace("$ITEMS", &items.to_string());
    db.batch_execute(&seed).await.expect("seed");
    db.batch_execute("VACUUM ANALYZE").await.expect("analyze");
    (db, notices)
}

#[tokio::test]
async fn the_hot_path_is_index_probes_at_a_million_items() {
    let (db, mut notices) = seeded(TENANTS, USERS, ITEMS).await;
    let (job, item, component): (uuid::Uuid, i64, String) = {
        let row = db
            .query_one(
                "SELECT job_id, id, component FROM work_items WHERE status = 'ready' LIMIT 1",
                &[],
            )
            .await
            .expect("an item");
        (row.get(0), row.get(1), row.get(2))
    };

    assert_metrics_gauges_probe_the_backlog(&db).await;

    let statements = [
        ("count_outstanding", jobs::CountOutstanding::SQL, "'tenant-7'".to_owned()),
        ("has_claimable_work", claims::HasClaimableWork::SQL, "'svc', 'pod-0'".to_owned()),
        ("extend_lease", endings::ExtendLease::SQL, format!("{item}, 1, 300000, NULL")),
        ("find_expired_leases", endings::FindExpiredLeases::SQL, "500".to_owned()),
        ("retire_queriers", tenancy::RetireQueriers::SQL, "60000".to_owned()),
        ("lock_job_owner", jobs::LockJobOwner::SQL, format!("'{job}'")),
        // Submission: a step's queue rows, whose ready_from is read off the primary key's end.
        (
            "create_step_queues",
            counters::CreateStepQueues::SQL,
            format!("'{job}', 0, ARRAY['{component}', 'querier']"),
        ),
        (
            "list_user_work",
            maintenance::ListUserWork::SQL,
            "NULL, NULL, 1000, NULL, NULL, NULL, NULL, NULL".to_owned(),
        ),
        (
            "list_user_work by user",
            maintenance::ListUserWork::SQL,
            "'svc', 'user-7', 1000, NULL, NULL, NULL, NULL, NULL".to_owned(),
        ),
        (
            "list_user_work after a cursor",
            maintenance::ListUserWork::SQL,
            format!("NULL, NULL, 1000, 'user-5', 'svc', '{job}', 0, 'unknown'"),
        ),
    ];
    db.batch_execute(AUTO_EXPLAIN).await.expect("auto_explain");
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        for (name, statement, arguments) in &statements {
            assert_index_probes(
                &format!("{name} ({mode})"),
                &plan(&db, statement, arguments).await,
            );
        }
        // The functions: a completion's counter moves, and claims from an unsharded querier
        // and from one that serves some sharded tenants, enough of them to go down actor paths.
        let deltas = format!(
            "SELECT * FROM apply_step_deltas('{job}', 0, '{component}', -1, 1, 0, 0, 0, 0, true)"
        );
        let tenant_deltas = format!(
            "SELECT apply_tenant_deltas(ARRAY['svc'], ARRAY['{component}'], ARRAY['tenant-7'], \
             ARRAY[1], ARRAY[false])"
        );
        let mut plans = nested_plans(&db, &mut notices, &deltas).await;
        plans.extend(nested_plans(&db, &mut notices, &tenant_deltas).await);
        plans.extend(nested_plans(&db, &mut notices, &claims("pod-0")).await);
        plans.extend(nested_plans(&db, &mut notices, &claims("pod-3")).await);
        // Where one tenant alone has work for the service, the fair claims take sets of the
        // order's head (claim_fair_round).
        let what = format!("a set of claims from the head of the order ({mode})");
        let setup = ONE_TENANT_ACTIVE;
        plans.extend(
            claim_plans_after(&db, &mut notices, setup, "LIMIT cardinality(p_slots)", &what).await,
        );
        // Where users were claimed elsewhere, the rows at the head lag their users: a claim
        // levels them, with those just behind, by key.
        let what = format!("a claim levelling the lagging rows at the head ({mode})");
        let setup = USERS_AHEAD_OF_THEIR_ROWS;
        plans.extend(claim_plans_after(&db, &mut notices, setup, "LIMIT 16", &what).await);
        let claims_then_endings = format!("{}; {}", claims("pod-0"), finish_running(false));
        let endings = nested_plans(&db, &mut notices, &claims_then_endings).await;
        assert!(
            endings.iter().any(|(text, _)| text.contains("actor_deltas")),
            "no plan of the endings' counter moves ({mode})"
        );
        assert!(
            endings.iter().any(|(text, _)| text.contains("FROM job_steps agg")),
            "no plan of the question whether a workflow grows ({mode})"
        );
        plans.extend(endings);
        let finish_jobs = format!("SELECT finish_jobs(ARRAY['{job}']::uuid[])");
        let jobs = nested_plans(&db, &mut notices, &finish_jobs).await;
        assert!(
            jobs.iter().any(|(text, _)| text.contains("UPDATE jobs j")),
            "no plan of finishing jobs ({mode})"
        );
        plans.extend(jobs);
        // A capped and rate-limited service: its policy row, and its running items counted
        // from the leases index, not from the backlog.
        let policed = format!(
            "INSERT INTO service_policies (service, max_running, rate_per_second, burst) \
             VALUES ('svc', 1000000, 1000, 100); {}",
            claims("pod-0")
        );
        let policed = nested_plans(&db, &mut notices, &policed).await;
        assert!(
            policed.iter().any(|(text, plan)| text.contains("FROM work_items w")
                && nodes(plan).iter().any(|node| node["Index Name"] == "work_items_leases")),
            "a capped service's running items are not counted from work_items_leases ({mode})"
        );
        plans.extend(policed);
        // Weighted, capped and rate-limited users and tenants: the users whose buckets came
        // due are found by users_throttled, and a tenant's running items are counted from the
        // leases index.
        let what = format!("claims of policed users and tenants ({mode})");
        let setup = USERS_AND_TENANTS_POLICED;
        let policed =
            claim_plans_after(&db, &mut notices, setup, "throttled_until <=", &what).await;
        for (index, what) in [
            ("users_throttled", "the users whose buckets came due"),
            ("work_items_leases", "a tenant's running items"),
        ] {
            assert!(
                policed
                    .iter()
                    .any(|(_, plan)| nodes(plan).iter().any(|node| node["Index Name"] == index)),
                "{what} are not read from {index} ({mode})"
            );
        }
        plans.extend(policed);
        // The promoter: its due items from work_items_scheduled, a batch of them made ready.
        let promotion =
            nested_plans(&db, &mut notices, "SELECT promote_scheduled_items(1, 500)").await;
        assert!(
            promotion.iter().any(|(_, plan)| nodes(plan)
                .iter()
                .any(|node| node["Index Name"] == "work_items_scheduled")),
            "the promoter does not read its due items from work_items_scheduled ({mode})"
        );
        plans.extend(promotion);
        let mut indexes = BTreeSet::new();
        let mut bounded_item_probe = false;
        for (text, plan) in &plans {
            assert_index_probes(&format!("{text} ({mode})"), plan);
            indexes.extend(nodes(plan).iter().filter_map(|node| node["Index Name"].as_str()));
            // A step's next item is read from its ready_from on, not over the dead entries of
            // the items claimed before it.
            bounded_item_probe |= nodes(plan).iter().any(|node| {
                node["Index Name"] == "work_items_ready"
                    && node["Index Cond"].as_str().is_some_and(|cond| cond.contains("id >="))
            });
        }
        assert!(bounded_item_probe, "no claim reads a step's items from its ready_from ({mode})");
        let expected_indexes = [
            "tenant_queues_fair_turns",
            "service_users_fair_turns",
            "actor_queues_fair_order",
            "user_work_claimable",
            "work_items_ready",
        ];
        for expected in expected_indexes {
            assert!(
                indexes.contains(expected),
                "claim ({mode}) does not use {expected}: {indexes:?}"
            );
        }
    }
}

/// The queue gauges of /metrics, taken afresh ($1 = 0): they read the backlog only by probes of
/// the ready and leases indexes, one per step with ready items and one per running item, and
/// the paused steps by their partial index. The counter tables (service_users, user_work) they
/// may read whole, as here where every step of user_work has ready items; where finished steps
/// outnumber them, user_work_claimable lists those that do.
async fn assert_metrics_gauges_probe_the_backlog(db: &tokio_postgres::Client) {
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        let plan = plan(db, maintenance::RefreshMetrics::SQL, "0").await;
        let mut indexes = BTreeSet::new();
        for node in nodes(&plan) {
            if node["Relation Name"] == "work_items" {
                let probe = ["work_items_ready", "work_items_leases"]
                    .iter()
                    .any(|index| node["Index Name"] == *index);
                assert!(probe, "the gauges read work_items otherwise ({mode}): {plan:#}");
            }
            indexes.extend(node["Index Name"].as_str());
        }
        for expected in ["work_items_ready", "work_items_leases", "user_work_paused"] {
            assert!(
                indexes.contains(expected),
                "the gauges ({mode}) do not use {expected}: {plan:#}"
            );
        }
    }
    db.batch_execute("RESET plan_cache_mode").await.expect("plan mode");
    let started = Instant::now();
    db.query_one(maintenance::RefreshMetrics::SQL, &[&0_i64]).await.expect("take the gauges");
    eprintln!("the queue gauges took {:?} at a million items", started.elapsed());
}

/// Every strategy's claim reads the claimable steps from the head of its order's index, and
/// each step it meets by key: never the backlog, never a sort.
#[tokio::test]
async fn every_strategy_is_index_probes_at_a_million_items() {
    let (db, mut notices) = seeded(TENANTS, USERS, ITEMS).await;
    db.batch_execute(AUTO_EXPLAIN).await.expect("auto_explain");
    let strategies = [
        ("oldest", "claimable_steps_oldest"),
        ("newest", "claimable_steps_oldest"),
        ("random", "claimable_steps_random"),
        ("priority", "claimable_steps_priority"),
        (
            r#"{"select_only": {"key": "mode", "value": "a", "then": "oldest"}}"#,
            "claimable_step_metadata_oldest",
        ),
        (
            r#"{"select_only": {"key": "mode", "value": "a", "then": "random"}}"#,
            "claimable_step_metadata_random",
        ),
        (
            r#"{"select_only": {"key": "mode", "value": "b", "then": "priority"}}"#,
            "claimable_step_metadata_priority",
        ),
        (
            r#"{"select_only": {"key": "mode", "value": "b", "then": "fair"}}"#,
            "claimable_step_metadata_oldest",
        ),
        (
            r#"{"prefer_distinct": {"key": "customer", "max": 1, "then": "random"}}"#,
            "strategy_running_pkey",
        ),
        (
            r#"{"max_simultaneous": {"key": "customer", "max": 1, "then": "oldest"}}"#,
            "strategy_running_pkey",
        ),
        (
            r#"{"or_else": [{"select_only": {"key": "mode", "value": "a", "then": "random"}},
                            "random"]}"#,
            "claimable_step_metadata_random",
        ),
    ];
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        for (strategy, expected) in strategies {
            let plans = nested_plans(&db, &mut notices, &strategy_claims(strategy)).await;
            let mut indexes = BTreeSet::new();
            for (text, plan) in &plans {
                assert_index_probes(&format!("{strategy}: {text} ({mode})"), plan);
                indexes.extend(nodes(plan).iter().filter_map(|node| node["Index Name"].as_str()));
            }
            for index in [expected, "work_items_ready"] {
                assert!(
                    indexes.contains(index),
                    "{strategy} ({mode}) does not use {index}: {indexes:?}"
                );
            }
        }
    }
}

/// At a thousand jobs the planner finds reading all of them about as cheap as probing a batch's
/// few: a batch of endings still finds its items' owners by key, whether it waits for held
/// owners or not, so that its cost does not follow the number of jobs.
#[tokio::test]
async fn a_batch_of_endings_finds_its_owners_by_key_at_a_thousand_jobs() {
    let (db, mut notices) = seeded(10, 500, 10_000).await;
    db.batch_execute(AUTO_EXPLAIN).await.expect("auto_explain");
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        for wait_for_owners in [false, true] {
            let batch = format!("{}; {}", claims("pod-0"), finish_running(wait_for_owners));
            let plans = nested_plans(&db, &mut notices, &batch).await;
            // The statements that read the batch's items or their owners (the million-item
            // test pins the rest, at its sizes).
            let endings: Vec<_> = plans
                .iter()
                .filter(|(text, _)| text.contains("p_ids") || text.contains("v_wanted"))
                .collect();
            assert!(
                endings.iter().any(|(text, _)| text.contains("FROM users u")),
                "no plan of the owners' lock ({mode}, waiting: {wait_for_owners})"
            );
            for (text, plan) in endings {
                assert_index_probes(&format!("{text} ({mode}, waiting: {wait_for_owners})"), plan);
            }
        }
    }
}

/// At a thousand users the planner, told to expect one claimed user where a set has a dozen,
/// finds reading the users table about as cheap as probing it: a set of claims still reads
/// every table by key, so that its cost does not follow the number of users.
#[tokio::test]
async fn a_set_of_claims_probes_its_users_by_key_at_a_thousand_users() {
    let (db, mut notices) = seeded(1, 1_000, 20_000).await;
    // One component of the one tenant has work, so that the claims take sets.
    db.batch_execute("UPDATE tenant_queues SET active = (component = 'ingester')")
        .await
        .expect("one active queue");
    db.batch_execute(AUTO_EXPLAIN).await.expect("auto_explain");
    let plans = nested_plans(&db, &mut notices, &claims("pod-0")).await;
    let sets: Vec<_> =
        plans.iter().filter(|(text, _)| text.contains("LIMIT cardinality(p_slots)")).collect();
    assert!(!sets.is_empty(), "no plan of a set of claims from the head of the order");
    for (text, plan) in sets {
        assert_index_probes(text, plan);
    }
}

/// The statements that address one running item by id read it by its primary key even while
/// the partial indexes over running and finished items are estimated empty, as they are after a
/// bulk load of ready items until the next ANALYZE, though thousands of items have run since.
#[tokio::test]
async fn items_are_addressed_by_primary_key_while_statistics_lag() {
    let (db, mut notices) = connect_with_notices().await;
    db.batch_execute(
        "INSERT INTO users (username) VALUES ('user-1');
         INSERT INTO jobs (job_id, username, is_async, tenant, actor)
         VALUES ('00000000-0000-0000-0000-000000000001', 'user-1', false, 'default', '{}');
         INSERT INTO job_steps (job_id, step_index, service, aggregate)
         SELECT job_id, 0, 'svc', false FROM jobs;
         INSERT INTO user_work (job_id, step_index, component, username, service, is_async,
                                tenant, actor)
         SELECT job_id, 0, 'unknown', username, 'svc', false, 'default', '{}' FROM jobs;
         INSERT INTO work_items (job_id, step_index, component, payload)
         SELECT '00000000-0000-0000-0000-000000000001', 0, 'unknown', '{}'
           FROM generate_series(1, 100000);",
    )
    .await
    .expect("seed");
    db.batch_execute("VACUUM ANALYZE").await.expect("analyze");
    db.batch_execute(
        "UPDATE work_items SET status = 'successful' WHERE id <= 20000;
         UPDATE work_items SET status = 'running', attempt = 1, lease_expires_at = now()
          WHERE id > 20000 AND id <= 25000;
         UPDATE user_work
            SET ready_count = 75000, running_count = 5000, successful_count = 20000;
         UPDATE users SET running_count = 5000;",
    )
    .await
    .expect("items run");
    db.batch_execute(AUTO_EXPLAIN).await.expect("auto_explain");
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        let extend = plan(&db, endings::ExtendLease::SQL, "24000, 1, 300000, NULL").await;
        let mut plans = vec![("extend_lease".to_owned(), extend)];
        plans.extend(nested_plans(&db, &mut notices, &finish(24000, 1)).await);
        assert_reads_through(&plans, "work_items", "work_items_pkey", mode);
    }
}

/// Fails unless every read of `relation` in `plans` (its own update's target aside) goes
/// through `index`.
fn assert_reads_through(plans: &[(String, Value)], relation: &str, index: &str, mode: &str) {
    for (name, plan) in plans {
        for node in nodes(plan) {
            if node["Relation Name"] == relation && node["Node Type"] != "ModifyTable" {
                assert_eq!(
                    node["Index Name"], index,
                    "{name} ({mode}) reads {relation} otherwise: {plan:#}"
                );
            }
        }
    }
}

/// A step made claimable brings its user's steps level by their primary key even while the
/// statistics say no step is claimable, as they do when one transaction makes thousands of
/// steps claimable: read from the claimable index, each step's trigger would walk every step
/// made claimable before it.
#[tokio::test]
async fn steps_made_claimable_are_levelled_by_key_while_statistics_lag() {
    let (db, mut notices) = connect_with_notices().await;
    db.batch_execute(
        "INSERT INTO users (username) VALUES ('user-1');
         INSERT INTO jobs (job_id, username, is_async, tenant, actor)
         SELECT md5('job-' || j)::uuid, 'user-1', false, 'default', '{}'
           FROM generate_series(1, 300) j;
         INSERT INTO job_steps (job_id, step_index, service, aggregate)
         SELECT job_id, 0, 'svc', false FROM jobs;
         INSERT INTO user_work (job_id, step_index, component, username, service, is_async,
                                tenant, actor)
         SELECT job_id, 0, 'unknown', username, 'svc', false, 'default', '{}' FROM jobs;
         INSERT INTO service_users (service, component, tenant, username, lone_job_id,
                                    lone_step_index)
         VALUES ('svc', 'unknown', 'default', 'user-1', md5('job-1')::uuid, 0);",
    )
    .await
    .expect("seed");
    db.batch_execute("VACUUM ANALYZE").await.expect("analyze");
    db.batch_execute(AUTO_EXPLAIN).await.expect("auto_explain");
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        let plans = nested_plans(&db, &mut notices, "UPDATE user_work SET ready_count = 1").await;
        let levelling: Vec<_> = plans
            .into_iter()
            .filter(|(text, _)| text.contains("SET order_worked = uw.last_worked"))
            .collect();
        assert!(!levelling.is_empty(), "no plan of the levelling ({mode})");
        assert_reads_through(&levelling, "user_work", "user_work_pkey", mode);
    }
}

/// Every claim and completion leaves dead versions of the fair order's rows, and their index
/// entries, at the head of the order where the next claim starts reading. The broker's own
/// vacuum clears them on its cadence, without waiting for autovacuum.
#[tokio::test]
async fn the_broker_vacuums_the_dead_rows_claims_leave_in_the_fair_order() {
    let mut args = ServeArgs::for_tests();
    args.vacuum.vacuum_interval = Duration::from_millis(100);
    let app = spawn_app_with(args).await;
    app.submit_simple("alice", "svc", 40, true).await;
    while let Some(item) = app.claim("svc").await {
        app.succeed(&item, json!([])).await;
    }
    // Statistics reach pg_stat_user_tables up to a second after the fact.
    let state =
        "SELECT coalesce(sum(vacuum_count), 0)::bigint, coalesce(sum(n_dead_tup), 0)::bigint
                   FROM pg_stat_user_tables
                  WHERE relname IN ('users', 'service_users', 'user_work')";
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = app.db.query_one(state, &[]).await.expect("table statistics");
        let (vacuums, dead): (i64, i64) = (row.get(0), row.get(1));
        if vacuums >= 3 && dead == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{vacuums} vacuums and {dead} dead rows left in the fair order's tables"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.assert_consistent().await;
}

/// SEED's million items all finished (a tenth failed), and its jobs finished a month ago; and
/// a big user, alone in its tenant, with a hundred thousand jobs, one of them of two hundred
/// thousand items over two steps.
const FINISHED: &str = "
UPDATE jobs SET status = 'successful', updated_at = now() - interval '30 days';
INSERT INTO users (username) VALUES ('user-big');
INSERT INTO tenants (tenant) VALUES ('tenant-big');
INSERT INTO jobs (job_id, username, is_async, tenant, actor, status, created_at, updated_at)
SELECT md5('big-' || j)::uuid, 'user-big', true, 'tenant-big', '{}',
       CASE WHEN j % 10 = 0 THEN 'failed' ELSE 'successful' END::job_status,
       now() - j * interval '1 second', now() - interval '30 days'
  FROM generate_series(1, 100000) j;
INSERT INTO job_steps (job_id, step_index, service, aggregate)
SELECT md5('big-1')::uuid, s, 'svc', false FROM generate_series(0, 1) s;
INSERT INTO user_work (job_id, step_index, component, username, service, is_async, tenant, actor)
SELECT md5('big-1')::uuid, s, 'unknown', 'user-big', 'svc', true, 'tenant-big', '{}'
  FROM generate_series(0, 1) s;
INSERT INTO work_items (job_id, step_index, component, status, payload)
SELECT md5('big-1')::uuid, i % 2, 'unknown',
       CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'successful' END::work_item_status, '{}'
  FROM generate_series(1, 200000) i;
";

/// Fails unless every read of work_items and jobs goes by one of `indexes` (or, for an item
/// the page already chose, the primary key), nothing is read by a sequential scan, and every
/// sort sorts what ranges stopped by a LIMIT read: a page's cost follows its limit, not the
/// size of the job or the table.
fn assert_bounded_ranges(name: &str, plan: &Value, indexes: &[&str]) {
    fn check(
        name: &str,
        node: &Value,
        sorted: bool,
        limited: bool,
        indexes: &[&str],
        plan: &Value,
    ) {
        let kind = node["Node Type"].as_str().unwrap_or_default();
        assert_ne!(kind, "Seq Scan", "{name} scans {}: {plan:#}", node["Relation Name"]);
        let relation = node["Relation Name"].as_str().unwrap_or_default();
        if ["work_items", "jobs"].contains(&relation) && kind != "ModifyTable" {
            // A bitmap heap scan reads by the indexes of the bitmap index scans below it.
            let by: Vec<&str> = nodes(node)
                .iter()
                .filter_map(|below| below["Index Name"].as_str())
                .take(if kind == "Bitmap Heap Scan" { usize::MAX } else { 1 })
                .collect();
            let known = |index: &&str| {
                indexes.contains(index) || ["work_items_pkey", "jobs_pkey"].contains(index)
            };
            assert!(
                !by.is_empty() && by.iter().all(known),
                "{name} reads {relation} by {by:?}: {plan:#}"
            );
            assert!(!sorted || limited, "{name} sorts an unlimited read of {relation}: {plan:#}");
        }
        let sorted = sorted || kind.contains("Sort");
        // A LIMIT above the sort bounds what reaches it, not what it reads.
        let limited = limited || (sorted && kind == "Limit");
        for child in node["Plans"].as_array().into_iter().flatten() {
            check(name, child, sorted, limited, indexes, plan);
        }
    }
    check(name, plan, false, false, indexes, plan);
}

/// The pruner's statements and the producers' listings at a million finished items over twenty
/// thousand jobs, and a user with a hundred thousand jobs: index ranges that stop at their batch
/// or page, whatever the size of the backlog, the job or the user.
#[tokio::test]
async fn pruning_and_listings_are_index_ranges_at_a_million_finished_items() {
    let (db, _notices) = connect_with_notices().await;
    let seed = SEED
        .replace("$TENANTS", &TENANTS.to_string())
        .replace("$USERS", &USERS.to_string())
        .replace("$ITEMS", &ITEMS.to_string())
        .replace(
            "CASE WHEN i % 10 = 0 THEN 'successful' ELSE 'ready' END",
            "CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'successful' END",
        );
    db.batch_execute(&seed).await.expect("seed");
    db.batch_execute(FINISHED).await.expect("finish the jobs");
    db.batch_execute("VACUUM ANALYZE").await.expect("analyze");
    let job: uuid::Uuid =
        db.query_one("SELECT md5('big-1')::uuid", &[]).await.expect("the big job").get(0);
    let oldest: String = db
        .query_one(
            "SELECT 'ARRAY[' || string_agg(quote_literal(job_id::text), ', ') || ']::uuid[]'
               FROM (SELECT job_id FROM jobs ORDER BY updated_at, job_id LIMIT 100) oldest",
            &[],
        )
        .await
        .expect("the oldest jobs")
        .get(0);
    let all_items = "ARRAY['ready', 'running', 'successful', 'failed', 'canceled']";
    let far_future =
        "'9999-12-31T23:59:59Z'::timestamptz, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid";
    let statements = [
        (
            "find_prunable_jobs",
            maintenance::FindPrunableJobs::SQL,
            "604800000, 100".to_owned(),
            &["jobs_finished"][..],
        ),
        (
            "prune_items",
            maintenance::PruneItems::SQL,
            format!("{oldest}, 1000"),
            &["work_items_by_job_status"][..],
        ),
        (
            "prune_jobs",
            maintenance::PruneJobs::SQL,
            oldest.clone(),
            &["work_items_by_job_status"][..],
        ),
        (
            "list_job_items",
            jobs::ListJobItems::SQL,
            format!("'{job}', {all_items}, 0, 2147483647, 0, 1000"),
            &["work_items_by_job_status"][..],
        ),
        (
            "list_job_items (results)",
            jobs::ListJobItems::SQL,
            format!("'{job}', ARRAY['successful'], 1, 1, 0, 1000"),
            &["work_items_by_job_status"][..],
        ),
        (
            "list_jobs of a user",
            jobs::ListJobs::SQL,
            format!("'user-big', NULL, ARRAY['successful', 'running'], {far_future}, 1000, NULL"),
            &["jobs_by_user_status", "jobs_by_tenant_status"][..],
        ),
        (
            "list_jobs of a user on a service",
            jobs::ListJobs::SQL,
            format!("'user-big', NULL, ARRAY['successful', 'running'], {far_future}, 1000, 'svc'"),
            &["jobs_by_user_status", "jobs_by_tenant_status"][..],
        ),
        (
            "list_jobs of a user in a tenant",
            jobs::ListJobs::SQL,
            format!("'user-big', 'tenant-big', ARRAY['successful'], {far_future}, 1000, NULL"),
            &["jobs_by_user_status", "jobs_by_tenant_status"][..],
        ),
        (
            "list_jobs of a tenant",
            jobs::ListJobs::SQL,
            format!("NULL, 'tenant-big', ARRAY['successful', 'failed'], {far_future}, 1000, NULL"),
            &["jobs_by_tenant_status", "jobs_by_user_status"][..],
        ),
        (
            "list_jobs of a tenant on a service",
            jobs::ListJobs::SQL,
            format!("NULL, 'tenant-big', ARRAY['successful', 'failed'], {far_future}, 1000, 'svc'"),
            &["jobs_by_tenant_status", "jobs_by_user_status"][..],
        ),
        ("get_jobs_steps", jobs::GetJobsSteps::SQL, oldest.clone(), &[][..]),
    ];
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        for (name, statement, arguments, indexes) in &statements {
            let plan = plan(&db, statement, arguments).await;
            assert_bounded_ranges(&format!("{name} ({mode})"), &plan, indexes);
            // The first index is the one the statement is for; the listing of jobs may also
            // read by the other branch's index in a generic plan, where both branches appear.
            if let Some(index) = indexes.first() {
                assert!(
                    nodes(&plan).iter().any(|node| node["Index Name"] == *index),
                    "{name} ({mode}) does not use {index}: {plan:#}"
                );
            }
        }
    }
}

/// A new job step reads its ready items from after every item that existed before it, not from
/// the first item of the table: when the planner walks the primary key for a step's next item
/// (as it may for a few large jobs), the first claim of a step submitted after a million items
/// would otherwise read through all of them. A workflow's later steps start the same way.
#[tokio::test]
async fn a_new_step_reads_its_items_from_after_everything_before_it() {
    let app = spawn_app_with(ServeArgs::for_tests()).await;
    app.submit_simple("alice", "svc", 50, true).await;
    let bobs = app
        .submit(json!({
            "user": "bob",
            "is_async": true,
            "steps": [{ "service": "svc" }, { "service": "later" }],
            "items": [{ "payload": 1 }, { "payload": 2 }],
        }))
        .await;
    assert_reads_from_its_first_item(&app, bobs, 0).await;
    // Bob's items, taken in turn with alice's, end and fan out to his second step.
    let mut ended = 0;
    while ended < 2 {
        let item = app.claim("svc").await.expect("an item of svc");
        if item["job_id"] == bobs.to_string() {
            app.succeed(&item, json!([{ "part": 1 }])).await;
            ended += 1;
        }
    }
    assert_reads_from_its_first_item(&app, bobs, 1).await;
}

/// Step `step` of `job`, none of whose items has been claimed yet, reads from no earlier than
/// the item created before its first, and no later than its first.
async fn assert_reads_from_its_first_item(app: &TestApp, job: uuid::Uuid, step: i32) {
    let bounds = "SELECT uw.ready_from, own.first,
                         (SELECT max(wi.id) FROM work_items wi WHERE wi.id < own.first)
                    FROM user_work uw,
                         LATERAL (SELECT min(wi.id) AS first FROM work_items wi
                                   WHERE (wi.job_id, wi.step_index) = (uw.job_id, uw.step_index)
                                 ) own
                   WHERE (uw.job_id, uw.step_index) = ($1, $2)";
    let row = app.db.query_one(bounds, &[&job, &step]).await.expect("the step's queue row");
    let (ready_from, first, before): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert!(
        before <= ready_from && ready_from <= first,
        "step {step} reads from {ready_from}: not between the item before it, {before}, and its \
         first, {first}"
    );
}

/// The pruner's delete of expired Idempotency-Keys at a million keys, half of them expired: a
/// range of idempotency_keys_expiry that stops at its batch, never a scan of the keys.
#[tokio::test]
async fn pruning_idempotency_keys_reads_the_expiry_index_at_a_million_keys() {
    let (db, _notices) = connect_with_notices().await;
    db.batch_execute(
        "INSERT INTO idempotency_keys (scope, key, request_digest, job_id, response, expires_at)
         SELECT 'user:u' || (i % 1000), 'key-' || i, '\\x00', md5(i::text)::uuid, '{}',
                now() + (i - 500000) * interval '1 second'
           FROM generate_series(1, 1000000) AS i",
    )
    .await
    .expect("seed the keys");
    db.batch_execute("VACUUM ANALYZE idempotency_keys").await.expect("analyze");
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        let plan = plan(&db, maintenance::PruneIdempotencyKeys::SQL, "1000").await;
        let all = nodes(&plan);
        assert!(
            all.iter().all(|node| node["Node Type"] != "Seq Scan"),
            "prune_idempotency_keys ({mode}) scans: {plan:#}"
        );
        assert!(
            all.iter().any(|node| node["Index Name"] == "idempotency_keys_expiry"),
            "prune_idempotency_keys ({mode}) does not read idempotency_keys_expiry: {plan:#}"
        );
    }
}
