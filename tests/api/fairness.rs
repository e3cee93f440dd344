//! Harmony's five steps, each on its own, and the shares they produce.

use std::pin::pin;

use serde_json::{json, Value};

use crate::helpers::{spawn_app, TestApp};

fn user_of(item: &Value) -> &str {
    item["user"].as_str().expect("user")
}

#[tokio::test]
async fn only_users_with_ready_work_for_the_service_are_considered() {
    let app = spawn_app().await;
    app.submit_simple("alice", "subsetter", 3, true).await;
    app.submit_simple("bob", "concat", 3, true).await;

    for _ in 0..3 {
        let item = app.claim("concat").await.expect("bob's work");
        assert_eq!(user_of(&item), "bob");
        assert_eq!(item["service"], "concat");
    }
    assert!(app.claim("concat").await.is_none(), "alice's work is for another service");
    app.assert_consistent().await;
}

#[tokio::test]
async fn least_work_in_progress_goes_first() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 5, true).await;
    // Alice has two items in progress before bob appears; bob was never worked, alice was.
    assert_eq!(user_of(&app.claim("svc").await.expect("item")), "alice");
    assert_eq!(user_of(&app.claim("svc").await.expect("item")), "alice");
    app.submit_simple("bob", "svc", 5, true).await;
    let bob_first = app.claim("svc").await.expect("item");
    assert_eq!(user_of(&bob_first), "bob");
    // Bob (1 in progress) is still behind alice's 2, though he was worked most recently.
    assert_eq!(user_of(&app.claim("svc").await.expect("item")), "bob");
    app.assert_consistent().await;
}

#[tokio::test]
async fn ties_in_progress_go_to_the_least_recently_worked_user() {
    let app = spawn_app().await;
    app.submit_simple("bob", "svc", 4, true).await;
    app.submit_simple("alice", "svc", 4, true).await;
    // Both idle and never worked: the name breaks the tie.
    let first = app.claim("svc").await.expect("item");
    assert_eq!(user_of(&first), "alice");
    app.succeed(&first, json!([])).await;
    // Equal work in progress (none); bob was worked less recently than alice.
    let second = app.claim("svc").await.expect("item");
    assert_eq!(user_of(&second), "bob");
    app.succeed(&second, json!([])).await;
    let third = app.claim("svc").await.expect("item");
    assert_eq!(user_of(&third), "alice");
    app.assert_consistent().await;
}

#[tokio::test]
async fn least_work_in_progress_counts_work_in_other_services() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 3, true).await;
    app.submit_simple("alice", "other", 2, true).await;
    app.submit_simple("bob", "svc", 3, true).await;
    // Alice holds two items of another service.
    app.claim("other").await.expect("item");
    app.claim("other").await.expect("item");
    let claims: Vec<String> = {
        let mut users = Vec::new();
        for _ in 0..3 {
            users.push(user_of(&app.claim("svc").await.expect("item")).to_owned());
        }
        users
    };
    // Bob catches up to alice's two before she gets any `svc` work.
    assert_eq!(claims[0], "bob");
    assert_eq!(claims[1], "bob");
    app.assert_consistent().await;
}

/// Alice's running count in her `svc` queue row, and in her users row.
async fn alices_running_counts(app: &crate::helpers::TestApp) -> (i32, i32) {
    let row = app
        .db
        .query_one(
            "SELECT su.running_count, u.running_count
               FROM service_users su
               JOIN users u USING (username)
              WHERE su.username = 'alice' AND su.service = 'svc'",
            &[],
        )
        .await
        .expect("alice's svc queue row");
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_claim_moves_only_the_queue_it_claims_from_and_lagging_rows_are_levelled() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 3, true).await;
    app.submit_simple("alice", "other", 2, true).await;
    app.submit_simple("bob", "svc", 3, true).await;
    let first = app.claim("other").await.expect("item");
    app.claim("other").await.expect("item");
    // Two claims elsewhere left alice's `svc` row behind her users row, which is allowed.
    assert_eq!(alices_running_counts(&app).await, (0, 2));
    app.assert_consistent().await;
    // Alice's lagging row sorts first in `svc`: the claim finds it lagging, levels it, and
    // serves bob.
    assert_eq!(user_of(&app.claim("svc").await.expect("item")), "bob");
    assert_eq!(alices_running_counts(&app).await, (2, 2));
    // An ending lowers its owner's rows that would otherwise lead.
    app.succeed(&first, json!([])).await;
    assert_eq!(alices_running_counts(&app).await, (1, 1));
    app.assert_consistent().await;
}

#[tokio::test]
async fn an_ending_leaves_its_owners_lagging_rows_for_the_claim_to_level() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 3, true).await;
    app.submit_simple("alice", "other", 2, true).await;
    app.submit_simple("bob", "svc", 1, true).await;
    let first = app.claim("other").await.expect("item");
    app.claim("other").await.expect("item");
    assert_eq!(alices_running_counts(&app).await, (0, 2));
    // Ending an item elsewhere leaves alice's `svc` row lagging: it still sorts no later than
    // she does, so no write is owed to it.
    app.succeed(&first, json!([])).await;
    assert_eq!(alices_running_counts(&app).await, (0, 1));
    app.assert_consistent().await;
    // The claim that finds it at the head levels it, and serves bob, who has none in progress.
    assert_eq!(user_of(&app.claim("svc").await.expect("item")), "bob");
    assert_eq!(alices_running_counts(&app).await, (1, 1));
    assert_eq!(user_of(&app.claim("svc").await.expect("item")), "alice");
    app.assert_consistent().await;
}

#[tokio::test]
async fn synchronous_jobs_go_before_asynchronous_ones_within_a_user() {
    let app = spawn_app().await;
    let async_job = app.submit_simple("alice", "svc", 3, true).await;
    let sync_job = app.submit_simple("alice", "svc", 3, false).await;
    for _ in 0..3 {
        let item = app.claim("svc").await.expect("item");
        assert_eq!(item["job_id"], sync_job.to_string());
    }
    let item = app.claim("svc").await.expect("item");
    assert_eq!(item["job_id"], async_job.to_string());
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_users_jobs_take_turns_by_least_recently_worked() {
    let app = spawn_app().await;
    let first = app.submit_simple("alice", "svc", 3, true).await;
    let second = app.submit_simple("alice", "svc", 3, true).await;
    let mut jobs = Vec::new();
    for _ in 0..4 {
        jobs.push(app.claim("svc").await.expect("item")["job_id"].as_str().expect("id").to_owned());
    }
    // Never-worked jobs first, then alternating by least recently worked.
    assert_ne!(jobs[0], jobs[1]);
    assert_eq!(jobs[0], jobs[2]);
    assert_eq!(jobs[1], jobs[3]);
    let ids = [first.to_string(), second.to_string()];
    assert!(ids.contains(&jobs[0]) && ids.contains(&jobs[1]));
    app.assert_consistent().await;
}

#[tokio::test]
async fn items_of_a_job_go_out_lowest_id_first() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 5, true).await;
    let mut ids = Vec::new();
    while let Some(item) = app.claim("svc").await {
        ids.push(item["id"].as_i64().expect("id"));
        assert_eq!(item["payload"]["n"], ids.len() - 1, "payloads in submission order");
    }
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted);
    assert_eq!(ids.len(), 5);
    app.assert_consistent().await;
}

/// Claims read a step's ready items from where the last claim left off (user_work.ready_from);
/// an item that becomes ready again goes before the later ones all the same.
#[tokio::test]
async fn a_retried_item_goes_out_before_the_later_items_of_its_job() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 4, true).await;
    let first = app.claim("svc").await.expect("item 1");
    let second = app.claim("svc").await.expect("item 2");
    let response =
        app.report(&first, json!({ "status": "failed", "attempt": 1, "error": "flaky" })).await;
    assert_eq!(response.status(), 200);
    let again = app.claim("svc").await.expect("the retried item");
    assert_eq!(again["id"], first["id"], "the lowest ready id goes first");
    assert_eq!(again["attempt"], 2);
    let third = app.claim("svc").await.expect("item 3");
    assert!(third["id"].as_i64() > second["id"].as_i64());
    app.assert_consistent().await;
}

/// The bound is a hint: with it past every ready item (as a claim that rolled back after a
/// later one moved it leaves it), the claims still find them, lowest id first.
#[tokio::test]
async fn a_bound_past_the_ready_items_loses_none_of_them() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 3, true).await;
    app.db
        .batch_execute("UPDATE user_work SET ready_from = 9223372036854775807")
        .await
        .expect("move the bound past every item");
    let mut ids = Vec::new();
    while let Some(item) = app.claim("svc").await {
        ids.push(item["id"].as_i64().expect("id"));
    }
    assert_eq!(ids.len(), 3, "every item handed out");
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "lowest id first: {ids:?}");
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_claim_records_when_the_user_and_job_were_last_worked() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 2, true).await;
    let rows = |body: Value| body["rows"].as_array().cloned().expect("rows");
    let before = rows(app.get("/admin/user-work?user=alice").await.json().await.expect("JSON"));
    assert_eq!(before.len(), 1);
    assert_eq!(before[0]["last_worked"], Value::Null);
    assert_eq!(before[0]["ready_count"], 2);

    app.claim("svc").await.expect("item");
    let after =
        rows(app.get("/admin/user-work?service=svc&user=alice").await.json().await.expect("JSON"));
    assert_eq!(after[0]["job_id"], job.to_string());
    assert!(after[0]["last_worked"].is_string(), "last_worked set: {after:?}");
    assert_eq!(after[0]["ready_count"], 1);
    assert_eq!(after[0]["running_count"], 1);
    app.assert_consistent().await;
}

#[tokio::test]
async fn two_users_share_claims_evenly_until_the_smaller_runs_out() {
    let app = spawn_app().await;
    app.submit_simple("big", "svc", 100, true).await;
    app.submit_simple("small", "svc", 10, true).await;
    let mut order = Vec::new();
    while let Some(item) = app.claim("svc").await {
        order.push(user_of(&item).to_owned());
    }
    assert_eq!(order.len(), 110);
    let small_in_first_20 = order[..20].iter().filter(|user| *user == "small").count();
    assert_eq!(small_in_first_20, 10, "even shares while both have work: {:?}", &order[..20]);
    assert!(order[20..].iter().all(|user| user == "big"));
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_batch_can_take_every_item_of_a_lone_user() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 20, true).await;
    let batch = app.claim_with("service=svc&querier=pod-0&max=20").await;
    assert_eq!(batch.len(), 20);
    app.assert_consistent().await;
}

#[tokio::test]
async fn a_batch_is_as_fair_as_single_claims() {
    let app = spawn_app().await;
    for user in ["a", "b", "c", "d"] {
        app.submit_simple(user, "svc", 10, true).await;
    }
    let batch = app.claim_with("service=svc&querier=pod-0&max=8").await;
    let mut users: Vec<&str> = batch.iter().map(user_of).collect();
    users.sort_unstable();
    assert_eq!(users, ["a", "a", "b", "b", "c", "c", "d", "d"]);
    app.assert_consistent().await;
}

/// Within one batch, each claim goes where one claim at a time would go: a user far behind
/// takes claim after claim until level, then the tie goes to the user worked less recently.
#[tokio::test]
async fn a_batch_serves_the_user_furthest_behind_until_level() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 10, true).await;
    for _ in 0..5 {
        assert_eq!(user_of(&app.claim("svc").await.expect("alice's item")), "alice");
    }
    app.submit_simple("bob", "svc", 10, true).await;
    let batch = app.claim_with("service=svc&querier=pod-0&max=6").await;
    let bobs = batch.iter().filter(|item| user_of(item) == "bob").count();
    assert_eq!((bobs, batch.len()), (5, 6), "bob five, then alice: {batch:?}");
    app.assert_consistent().await;
}

/// A batch takes several users from the head of the order as one set where that is exact:
/// users at the same work in progress and the next level up, in least-recently-worked order,
/// each stamped in pick order. It must hand out what one claim at a time hands out, in the
/// same order, and leave the same order behind.
#[tokio::test]
async fn a_batch_hands_out_what_single_claims_would_in_the_same_order() {
    let (batched, single) = (spawn_app().await, spawn_app().await);
    for app in [&batched, &single] {
        for user in ["a", "b", "c", "d", "e", "f"] {
            app.submit_simple(user, "svc", 10, true).await;
        }
        // a, b and c take one item each; a's ends, so a is back at none in progress but
        // worked more recently than d, e and f, who never were.
        let a_first = app.claim("svc").await.expect("a's item");
        for expected in ["b", "c"] {
            assert_eq!(user_of(&app.claim("svc").await.expect("an item")), expected);
        }
        app.succeed(&a_first, json!([])).await;
    }

    let sequence =
        batch_against_single_claims(&batched, &single, 10, |item| user_of(item).to_owned()).await;
    assert_eq!(sequence, ["d", "e", "f", "a", "b", "c", "d", "e", "f", "a"]);
    // The order each leaves behind is the same too: the next claim goes to the same user.
    let next = |item: Option<Value>| user_of(&item.expect("an item")).to_owned();
    assert_eq!(next(batched.claim("svc").await), next(single.claim("svc").await));
}

/// A newcomer far behind takes pick after pick even when the head holds a user for every
/// item wanted: those users are more than one level ahead, so they cannot share its turns.
#[tokio::test]
async fn a_batch_with_a_full_head_still_serves_the_user_behind_until_level() {
    let (batched, single) = (spawn_app().await, spawn_app().await);
    for app in [&batched, &single] {
        for user in ["a", "b", "c"] {
            app.submit_simple(user, "svc", 10, true).await;
        }
        for expected in ["a", "b", "c", "a", "b", "c"] {
            assert_eq!(user_of(&app.claim("svc").await.expect("an item")), expected);
        }
        app.submit_simple("d", "svc", 10, true).await;
    }
    let sequence =
        batch_against_single_claims(&batched, &single, 4, |item| user_of(item).to_owned()).await;
    assert_eq!(sequence, ["d", "d", "a", "b"]);
}

/// A user with two steps takes them in turn, least recently worked first, in a batch's sets
/// as in single claims.
#[tokio::test]
async fn a_batch_gives_a_user_its_steps_in_turn_as_single_claims_do() {
    let (batched, single) = (spawn_app().await, spawn_app().await);
    for app in [&batched, &single] {
        // a's first job is worked before the others arrive, so that its two steps have an
        // order: the one never worked first.
        submit_labelled(app, "a", "a1").await;
        assert_eq!(label(&app.claim("svc").await.expect("a's item")), "a1-0");
        for (user, job) in [("a", "a2"), ("b", "b1"), ("c", "c1")] {
            submit_labelled(app, user, job).await;
        }
    }
    let sequence = batch_against_single_claims(&batched, &single, 9, label).await;
    let expected = ["b1-0", "c1-0", "a2-0", "b1-1", "c1-1", "a1-1", "b1-2", "c1-2", "a2-1"];
    assert_eq!(sequence, expected);
}

/// Submits a one-step job of five items for `user`, each item's payload naming `job`.
async fn submit_labelled(app: &TestApp, user: &str, job: &str) {
    let items: Vec<Value> = (0..5).map(|n| json!({ "payload": { "job": job, "n": n } })).collect();
    app.submit(json!({ "user": user, "steps": [{ "service": "svc" }], "items": items })).await;
}

/// An item submitted by submit_labelled, as job-n.
fn label(item: &Value) -> String {
    format!("{}-{}", item["payload"]["job"].as_str().unwrap_or("?"), item["payload"]["n"])
}

/// A set reads the order from users' queue rows, whose copies of a user's counts may lag
/// them; the head stops standing for the order at a lagging row, and the batch then goes on
/// as single claims do, bringing the row level first.
#[tokio::test]
async fn a_batch_stops_its_set_at_a_lagging_row_as_single_claims_would() {
    let (batched, single) = (spawn_app().await, spawn_app().await);
    for app in [&batched, &single] {
        app.submit_simple("a", "svc", 5, true).await;
        app.submit_simple("b", "svc", 5, true).await;
        app.submit_simple("b", "other", 5, true).await;
        // b's work in `other` moves its users row and that queue's row; its row in svc's
        // order lags, saying 0 in progress where b has 2.
        for _ in 0..2 {
            assert_eq!(user_of(&app.claim("other").await.expect("b's item")), "b");
        }
    }
    let sequence =
        batch_against_single_claims(&batched, &single, 5, |item| user_of(item).to_owned()).await;
    assert_eq!(sequence, ["a", "a", "b", "a", "b"]);
}

/// A set reads the users' steps as its statement began but locks each user only when it reaches
/// it. A step made claimable by a transaction that commits in between must end the set before
/// that user: the set would otherwise take the user's other step for its only claimable one and
/// leave that step's place in the user's order behind (track_claimable_step).
#[tokio::test]
async fn a_step_made_claimable_while_a_set_runs_ends_the_set_before_its_user() {
    const HELD: i64 = 4_600_046;
    let app = spawn_app().await;
    // A rate limit on a makes the set work out a's bucket after locking a and before locking b;
    // the bucket's function here waits while the test holds HELD.
    let response = app
        .request(reqwest::Method::PUT, "/admin/users/a")
        .json(&json!({ "rate_per_second": 1000.0, "burst": 100 }))
        .send()
        .await
        .expect("PUT");
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    app.submit_simple("a", "svc", 5, true).await;
    app.submit_simple("b", "svc", 5, true).await;
    app.db
        .batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION bucket_tokens(p_rate double precision, p_burst integer,
                                                    p_next_free timestamptz)
             RETURNS bigint LANGUAGE plpgsql STABLE AS $held$
             BEGIN
                 PERFORM pg_advisory_lock_shared({HELD});
                 PERFORM pg_advisory_unlock_shared({HELD});
                 RETURN p_burst;
             END $held$;
             SELECT pg_advisory_lock({HELD});"
        ))
        .await
        .expect("hold the set at a's bucket");

    let mut claim = pin!(app.claim_with("service=svc&querier=pod-0&max=2"));
    app.await_held_on_advisory_lock(&mut claim, "claim_items", "the set reached a's bucket").await;
    // b's second job commits while the set is at a, before it locks b.
    tokio::select! {
        _ = &mut claim => panic!("the set went on while held"),
        _ = app.submit_simple("b", "svc", 5, true) => {}
    }
    app.db.execute("SELECT pg_advisory_unlock($1)", &[&HELD]).await.expect("let the set go");

    let mut users: Vec<String> = claim.await.iter().map(|item| user_of(item).to_owned()).collect();
    users.sort_unstable();
    assert_eq!(users, ["a", "b"]);
    app.assert_consistent().await;
}

/// Where users are claimed in several services, the rows behind a lagging one mostly lag too:
/// the claim that meets one at the head of its order levels those of free users with it,
/// rather than meeting them one look at a time.
#[tokio::test]
async fn a_claim_levels_the_lagging_rows_behind_the_one_it_meets() {
    let app = spawn_app().await;
    for user in ["ann", "dan"] {
        app.submit_simple(user, "svc", 2, true).await;
        app.submit_simple(user, "other", 2, true).await;
    }
    app.submit_simple("cat", "svc", 2, true).await;
    for _ in 0..2 {
        app.claim("other").await.expect("an item elsewhere");
    }
    let copies = "SELECT su.username, su.running_count, u.running_count
                    FROM service_users su
                    JOIN users u USING (username)
                   WHERE su.service = 'svc'
                   ORDER BY su.username";
    let counts = |rows: Vec<tokio_postgres::Row>| -> Vec<(String, i32, i32)> {
        rows.iter().map(|row| (row.get(0), row.get(1), row.get(2))).collect()
    };
    let before = counts(app.db.query(copies, &[]).await.expect("svc rows"));
    assert_eq!(
        before,
        [("ann".to_owned(), 0, 1), ("cat".to_owned(), 0, 0), ("dan".to_owned(), 0, 1)]
    );
    // Ann's row lags at the head: the claim levels it and dan's behind cat's, then serves cat,
    // leaving dan's where it belongs though no claim reached it.
    assert_eq!(user_of(&app.claim("svc").await.expect("an item")), "cat");
    let after = counts(app.db.query(copies, &[]).await.expect("svc rows"));
    assert_eq!(
        after,
        [("ann".to_owned(), 1, 1), ("cat".to_owned(), 1, 1), ("dan".to_owned(), 1, 1)]
    );
    app.assert_consistent().await;
}

/// Claims `max` items of svc in one batch from `batched`, and one at a time from `single`,
/// two brokers holding the same work; asserts both handed out the same items, named by
/// `name`, in the same order, and that both brokers' counters still add up, and returns that
/// order.
async fn batch_against_single_claims(
    batched: &TestApp,
    single: &TestApp,
    max: usize,
    name: impl Fn(&Value) -> String,
) -> Vec<String> {
    let batch: Vec<String> = batched
        .claim_with(&format!("service=svc&querier=pod-0&max={max}"))
        .await
        .iter()
        .map(&name)
        .collect();
    let mut one_at_a_time = Vec::new();
    for _ in 0..max {
        one_at_a_time.push(name(&single.claim("svc").await.expect("an item")));
    }
    assert_eq!(batch, one_at_a_time, "a batch against single claims");
    batched.assert_consistent().await;
    single.assert_consistent().await;
    one_at_a_time
}

#[tokio::test]
async fn within_a_user_a_higher_priority_goes_first_but_not_before_synchronous_work() {
    let app = spawn_app().await;
    let job = |priority: i32, is_async: bool, n: i32| {
        json!({ "user": "pia", "is_async": is_async, "priority": priority,
                "steps": [{ "service": "prio" }], "items": [{ "payload": { "n": n } }] })
    };
    app.submit(job(0, true, 1)).await;
    app.submit(job(7, true, 2)).await;
    app.submit(job(-3, false, 3)).await;
    app.submit(job(2, true, 4)).await;
    let mut order = Vec::new();
    while let Some(item) = app.claim("prio").await {
        order.push(item["payload"]["n"].as_i64().expect("n"));
    }
    assert_eq!(order, [3, 2, 4, 1], "sync first, then by priority, highest first");
    app.assert_consistent().await;
}
