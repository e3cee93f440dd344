//! The plans the hot path relies on, pinned at a million ready items and ten thousand users:
//! every statement a claim or a status update runs is index probes, never a scan of the
//! backlog or of the users, and never a sort; so is the operators' user_work listing.

use serde_json::Value;

use fairway::broker::sql;

use crate::helpers::fresh_database;

const USERS: i32 = 10_000;
const ITEMS: i32 = 1_000_000;

/// Two jobs per user (one synchronous), a million ready items dealt over them, a share of them
/// finished, and counters to match; then statistics, as autovacuum would leave them.
const SEED: &str = "
INSERT INTO users (username) SELECT 'user-' || u FROM generate_series(1, $USERS) u;
INSERT INTO jobs (job_id, username, is_async)
SELECT md5('job-' || u || '-' || j)::uuid, 'user-' || u, j = 2
  FROM generate_series(1, $USERS) u, generate_series(1, 2) j;
INSERT INTO user_work (job_id, step_index, username, service, is_async, aggregate)
SELECT job_id, 0, username, 'svc', is_async, false FROM jobs;
INSERT INTO work_items (job_id, step_index, status, payload)
SELECT md5('job-' || (i % $USERS + 1) || '-' || (i % 2 + 1))::uuid, 0,
       CASE WHEN i % 10 = 0 THEN 'successful' ELSE 'ready' END::work_item_status, '{}'
  FROM generate_series(1, $ITEMS) i;
UPDATE user_work uw SET ready_count = c.ready, successful_count = c.done
  FROM (SELECT job_id, count(*) FILTER (WHERE status = 'ready') AS ready,
               count(*) FILTER (WHERE status = 'successful') AS done
          FROM work_items GROUP BY job_id) c
 WHERE c.job_id = uw.job_id;
INSERT INTO service_users (service, username, ready_count)
SELECT 'svc', username, sum(ready_count) FROM user_work GROUP BY username;
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

#[tokio::test]
async fn the_hot_path_is_index_probes_at_a_million_items() {
    let config = fresh_database().await;
    let (db, connection) = config.connect(tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    let seed = SEED.replace("$USERS", &USERS.to_string()).replace("$ITEMS", &ITEMS.to_string());
    db.batch_execute(&seed).await.expect("seed");
    db.batch_execute("VACUUM ANALYZE").await.expect("analyze");
    let (job, item): (uuid::Uuid, i64) = {
        let row = db
            .query_one("SELECT job_id, id FROM work_items WHERE status = 'ready' LIMIT 1", &[])
            .await
            .expect("an item");
        (row.get(0), row.get(1))
    };

    let statements = [
        ("claim_next_item", sql::CLAIM_NEXT_ITEM, "'svc', 'pod-0', 0, 300000".to_owned()),
        ("has_claimable_work", sql::HAS_CLAIMABLE_WORK, "'svc'".to_owned()),
        (
            "finish_item",
            sql::FINISH_ITEM,
            format!("{item}, 1, 'successful', '[]'::jsonb, NULL, false"),
        ),
        ("apply_step_deltas", sql::APPLY_STEP_DELTAS, format!("'{job}', 0, -1, 1, 0, 0, 0")),
        ("extend_lease", sql::EXTEND_LEASE, format!("{item}, 1, 300000")),
        ("find_expired_leases", sql::FIND_EXPIRED_LEASES, "500".to_owned()),
        ("refresh_job_status", sql::REFRESH_JOB_STATUS, format!("'{job}'")),
        ("lock_job_owner", sql::LOCK_JOB_OWNER, format!("'{job}'")),
        ("list_user_work", sql::LIST_USER_WORK, "NULL, NULL, 1000".to_owned()),
        ("list_user_work by user", sql::LIST_USER_WORK, "'svc', 'user-7', 1000".to_owned()),
    ];
    for mode in ["force_custom_plan", "force_generic_plan"] {
        db.batch_execute(&format!("SET plan_cache_mode = {mode}")).await.expect("plan mode");
        for (name, statement, arguments) in &statements {
            let plan = plan(&db, statement, arguments).await;
            for node in nodes(&plan) {
                let kind = node["Node Type"].as_str().unwrap_or_default();
                assert_ne!(
                    kind, "Seq Scan",
                    "{name} ({mode}) scans {}: {plan:#}",
                    node["Relation Name"]
                );
                assert_ne!(kind, "Bitmap Heap Scan", "{name} ({mode}): {plan:#}");
                assert!(!kind.contains("Sort"), "{name} ({mode}) sorts: {plan:#}");
            }
        }
        let claim = plan(&db, sql::CLAIM_NEXT_ITEM, &statements[0].2).await;
        let indexes: Vec<&str> =
            nodes(&claim).iter().filter_map(|node| node["Index Name"].as_str()).collect();
        for expected in ["service_users_fair_order", "user_work_claimable", "work_items_ready"] {
            assert!(
                indexes.contains(&expected),
                "claim ({mode}) does not use {expected}: {indexes:?}"
            );
        }
    }
}
