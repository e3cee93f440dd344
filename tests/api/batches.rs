//! Group commit: claims and attempt endings that arrive together share one transaction, and
//! each still gets its own answer.

use std::pin::pin;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_postgres::types::Json;

use fairway_broker::db::sql::Statement;
use fairway_broker::statements::{claims, endings};

use crate::helpers::{spawn_app, spawn_app_with, TestApp};

/// One claim statement for requests of two services and three queriers, one of them not a
/// member yet and one shutting down: each request is answered for itself.
#[tokio::test]
async fn one_claim_batch_answers_each_request_for_its_own_querier() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc-a", 3, true).await;
    app.submit_simple("bob", "svc-b", 1, true).await;
    app.db
        .batch_execute(
            "INSERT INTO queriers (querier) VALUES ('pod-a');
             INSERT INTO queriers (querier, state) VALUES ('pod-leaving', 'shutting_down');",
        )
        .await
        .expect("queriers");
    let services = ["svc-a", "svc-b", "svc-a", "svc-a", "svc-b"];
    let queriers = ["pod-a", "pod-new", "pod-leaving", "pod-a", "pod-a"];
    let (workers, maxes) = ([0, 1, 2, 3, 4], [2, 1, 1, 1, 1]);
    let rows = app
        .db
        .query(
            claims::ClaimItems::SQL,
            &[
                &&services[..],
                &&queriers[..],
                &&workers[..],
                &&maxes[..],
                &300_000_i64,
                &1_000_i64,
                &vec![None::<serde_json::Value>; services.len()],
                &vec![None::<i64>; services.len()],
            ],
        )
        .await
        .expect("claim_items");
    let answers: Vec<(i32, Option<String>, Option<i64>)> = rows
        .iter()
        .map(|row| (row.get("request"), row.get("querier_state"), row.get("id")))
        .collect();
    let answer = |request: i32| -> Vec<&(i32, Option<String>, Option<i64>)> {
        answers.iter().filter(|answer| answer.0 == request).collect()
    };
    // The first asked for two of alice's three items and got them; the fourth got the third.
    assert_eq!(answer(1).len(), 2, "{answers:?}");
    assert!(answer(1)
        .iter()
        .all(|(_, state, id)| state.as_deref() == Some("active") && id.is_some()));
    assert_eq!(answer(4).len(), 1);
    assert!(answer(4)[0].2.is_some(), "{answers:?}");
    // Not a member: nothing looked at, so the broker has it join and asks again.
    assert_eq!(answer(2), vec![&(2, None, None)]);
    assert_eq!(answer(3), vec![&(3, Some("shutting_down".to_owned()), None)]);
    assert!(answer(5)[0].2.is_some(), "bob's item for pod-a: {answers:?}");
    let claimed: Vec<i64> = answers.iter().filter_map(|answer| answer.2).collect();
    let distinct: std::collections::BTreeSet<_> = claimed.iter().collect();
    assert_eq!(distinct.len(), 4, "every item once: {claimed:?}");
    app.assert_consistent().await;
}

/// An ending that does not apply (here a stale attempt) is left out of its batch's answer, and
/// the others of the batch apply.
#[tokio::test]
async fn a_refused_ending_does_not_fail_its_batch() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 5, true).await;
    let items = app.claim_with("service=svc&querier=pod&max=5").await;
    let ids: Vec<i64> = items.iter().filter_map(|item| item["id"].as_i64()).collect();
    assert_eq!(ids.len(), 5);
    let answers = end_successfully(&app, &ids, &[1, 1, 7, 1, 1]).await;
    assert_eq!(answers, vec![(1, false), (2, false), (4, false), (5, false)]);
    let response =
        app.report(&items[2], json!({ "status": "successful", "attempt": 1, "results": [] })).await;
    assert_eq!(response.status(), 200, "the third item was still running");
    app.assert_consistent().await;
}

/// An ending whose transaction fails (here a trigger refuses one item's results) gets a server
/// error while the endings sent with it apply, and the connections it used go back to the
/// pool outside any transaction: the broker goes on answering, and the refused item can still
/// end.
#[tokio::test]
async fn a_failed_ending_transaction_is_rolled_back_and_the_others_apply() {
    let app = spawn_app().await;
    let job = app.submit_simple("alice", "svc", 3, true).await;
    let items = app.claim_with("service=svc&querier=pod&max=3").await;
    assert_eq!(items.len(), 3);
    app.db
        .batch_execute(
            r#"CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN RAISE EXCEPTION 'poisoned results'; END $$;
               CREATE TRIGGER refuse_poison BEFORE UPDATE ON work_items FOR EACH ROW
                 WHEN (NEW.results = '["poison"]'::jsonb) EXECUTE FUNCTION refuse_poison();"#,
        )
        .await
        .expect("trigger");
    let results = [json!(["poison"]), json!([]), json!([])];
    let responses =
        futures_util::future::join_all(items.iter().zip(&results).map(|(item, results)| {
            app.report(item, json!({ "status": "successful", "attempt": 1, "results": results }))
        }))
        .await;
    let statuses: Vec<u16> = responses.iter().map(|response| response.status().as_u16()).collect();
    assert!(statuses[0] >= 500, "the poisoned ending fails: {statuses:?}");
    assert_eq!(&statuses[1..], &[200, 200], "the others apply: {statuses:?}");
    // Every connection of the pool is used again in turn; one left inside the failed
    // transaction would fail whichever request got it next.
    for _ in 0..50 {
        assert!(app.claim("svc").await.is_none(), "the item is still leased");
    }
    app.succeed(&items[0], json!([])).await;
    assert_eq!(app.job(job).await["status"], "successful");
    app.assert_consistent().await;
}

/// A batch of endings does not wait for an owner's row that another transaction holds: the
/// ending goes again in a later batch and finally waits alone, its item untouched meanwhile,
/// while the other owners' endings apply, rather than hold up every ending queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ending_whose_owner_is_held_holds_up_no_other_ending() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 1, true).await;
    app.submit_simple("bob", "svc", 1, true).await;
    let items = app.claim_with("service=svc&querier=pod&max=2").await;
    let (Some(alices), Some(bobs)) = (
        items.iter().find(|item| item["user"] == "alice"),
        items.iter().find(|item| item["user"] == "bob"),
    ) else {
        panic!("one item each for alice and bob: {items:?}");
    };
    // Alice's row held by a transaction of our own, as a claim batch holds its users' rows.
    let holder = hold_users_row(&app, "alice").await;

    let success = json!({ "status": "successful", "attempt": 1, "results": [] });
    let alices_ending = app.report(alices, success.clone());
    futures_util::pin_mut!(alices_ending);
    // Alice's ending goes first, and on until it waits for her row (after a few deferrals, in
    // a transaction of its own); only then Bob's. The bounds only turn a hang into a failure.
    let waiting = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            tokio::select! {
                _ = &mut alices_ending => panic!("alice's ending applied while her row was held"),
                _ = tokio::task::yield_now() => {}
            }
            let row = app
                .db
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("lock waits");
            if row.get::<_, i64>(0) > 0 {
                return;
            }
        }
    });
    waiting.await.expect("alice's ending never waited for her row");
    let bobs_answer = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            answer = app.report(bobs, success) => answer,
            _ = &mut alices_ending => panic!("alice's ending applied while her row was held"),
        }
    })
    .await
    .expect("bob's ending waited behind alice's");
    assert_eq!(bobs_answer.status(), StatusCode::OK);
    let alices_status: String = app
        .db
        .query_one("SELECT status::text FROM work_items WHERE id = $1", &[&alices["id"].as_i64()])
        .await
        .expect("alice's item")
        .get(0);
    assert_eq!(alices_status, "running", "alice's item changed while her row was held");

    holder.batch_execute("COMMIT").await.expect("release alice's row");
    assert_eq!(alices_ending.await.status(), StatusCode::OK);
    // Operators see it: alice's ending went again ten times, then waited; bob's never did.
    let scraped = crate::metrics::scrape(&app).await;
    let deferrals = |then| scraped.get("fairway_ending_deferrals_total", &[("then", then)]);
    assert_eq!((deferrals("sent_again"), deferrals("waited")), (10.0, 1.0));
    app.assert_consistent().await;
}

/// Each owner's reports go to one ending lane: with four lanes, reports on two users' items all
/// at once never find an owner's row held by another of the broker's lanes, so none is deferred
/// (no claim runs meanwhile to hold one).
#[tokio::test]
async fn one_owners_endings_keep_to_one_lane_and_never_defer_each_other() {
    let mut args = fairway_server::config::ServeArgs::for_tests();
    args.batches.ending_lanes = 4;
    args.batches.batch_max = 4;
    let app = spawn_app_with(args).await;
    app.submit_simple("alice", "svc", 48, true).await;
    app.submit_simple("bob", "svc", 48, true).await;
    let items = app.claim_with("service=svc&querier=pod&max=96").await;
    assert_eq!(items.len(), 96);
    let reports = items.iter().map(|item| {
        let attempt = item["attempt"].clone();
        app.report(item, json!({ "status": "successful", "attempt": attempt, "results": [] }))
    });
    for answer in futures_util::future::join_all(reports).await {
        assert_eq!(answer.status(), StatusCode::OK);
    }
    let scraped = crate::metrics::scrape(&app).await;
    let deferrals =
        |then| scraped.value("fairway_ending_deferrals_total", &[("then", then)]).unwrap_or(0.0);
    assert_eq!((deferrals("sent_again"), deferrals("waited")), (0.0, 0.0));
    app.assert_consistent().await;
}

/// A batch that does not wait for held owners answers each ending for what happened to it:
/// applied, deferred (its owner's row was held, and its item still runs under that attempt),
/// or no row at all (refused: here a stale attempt).
#[tokio::test]
async fn a_batch_tells_deferred_endings_from_applied_and_refused_ones() {
    let app = spawn_app().await;
    app.submit_simple("alice", "svc", 1, true).await;
    app.submit_simple("bob", "svc", 2, true).await;
    let items = app.claim_with("service=svc&querier=pod&max=3").await;
    let id_of = |user: &str, nth: usize| {
        items
            .iter()
            .filter(|item| item["user"] == user)
            .nth(nth)
            .and_then(|item| item["id"].as_i64())
    };
    let (Some(alices), Some(bobs), Some(bobs_second)) =
        (id_of("alice", 0), id_of("bob", 0), id_of("bob", 1))
    else {
        panic!("one item for alice and two for bob: {items:?}");
    };
    let holder = hold_users_row(&app, "alice").await;

    let answers = end_successfully(&app, &[alices, bobs, bobs_second], &[1, 1, 2]).await;
    assert_eq!(
        answers,
        vec![(1, true), (2, false)],
        "alice's deferred, bob's applied, the stale one refused"
    );
    let alices_item = app
        .db
        .query_one("SELECT status::text, attempt FROM work_items WHERE id = $1", &[&alices])
        .await
        .expect("alice's item");
    assert_eq!(
        (alices_item.get::<_, String>(0), alices_item.get::<_, i32>(1)),
        ("running".to_owned(), 1)
    );

    holder.batch_execute("COMMIT").await.expect("release alice's row");
    app.assert_consistent().await;
}

/// A connection whose open transaction holds `user`'s users row until it commits.
async fn hold_users_row(app: &TestApp, user: &str) -> tokio_postgres::Client {
    let (holder, connection) = app.config.connect().await.expect("a second connection");
    tokio::spawn(connection);
    holder.batch_execute("BEGIN").await.expect("begin");
    holder
        .execute("SELECT 1 FROM users WHERE username = $1 FOR NO KEY UPDATE", &[&user])
        .await
        .expect("hold the user's row");
    holder
}

/// Ends attempts `attempts` of items `ids` successfully in one batch that does not wait for
/// held owners, and returns each answered ending's number and whether it was deferred.
async fn end_successfully(app: &TestApp, ids: &[i64], attempts: &[i32]) -> Vec<(i32, bool)> {
    let statuses = vec!["successful"; ids.len()];
    let empty: Vec<Value> = Vec::new();
    let results = vec![Some(Json(&empty)); ids.len()];
    let nothing: Vec<Option<&str>> = vec![None; ids.len()];
    let digests: Vec<Option<&[u8]>> = vec![None; ids.len()];
    let no = vec![false; ids.len()];
    let tokens: Vec<Option<i64>> = vec![None; ids.len()];
    let delays: Vec<Option<i64>> = vec![None; ids.len()];
    let finish = endings::FinishItems {
        ids,
        attempts,
        statuses: &statuses,
        results: &results,
        errors: &nothing,
        next_components: &nothing,
        digests: &digests,
        uncounted: &no,
        expired_only: false,
        wait_for_owners: false,
        tokens: &tokens,
        delays_millis: &delays,
        handed_back: &no,
        warnings: &nothing,
    };
    let rows =
        app.db.query(endings::FinishItems::SQL, &finish.params()).await.expect("finish_items");
    let mut answers: Vec<(i32, bool)> =
        rows.iter().map(|row| (row.get("ending"), row.get("deferred"))).collect();
    answers.sort_unstable();
    answers
}

/// A service's claims take turns, in every broker: a claim batch waits for its service's claim
/// lock, here held by another session as another broker's batch would hold it, while a claim
/// for another service goes on in a lane of its own.
#[tokio::test]
async fn a_services_claims_take_turns_while_other_services_go_on_beside_them() {
    let app = spawn_app().await;
    app.submit_simple("alice", "held", 1, true).await;
    app.submit_simple("bob", "free", 1, true).await;
    let (holder, connection) = app.config.connect().await.expect("a second connection");
    tokio::spawn(connection);
    holder
        .batch_execute(
            "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('fairway claims held', 0))",
        )
        .await
        .expect("hold the service's claim lock");

    let mut held_claim = pin!(app.claim("held"));
    let what = "the claim waited for its service's claim lock";
    app.await_held_on_advisory_lock(&mut held_claim, "claim_items", what).await;
    let within = Duration::from_secs(10);
    let other = tokio::select! {
        _ = &mut held_claim => panic!("the claim went on while its service's lock was held"),
        other = tokio::time::timeout(within, app.claim("free")) => other,
    };
    let other = other.expect("a claim for another service waited behind the held one");
    assert!(other.is_some(), "a claim for another service got nothing");

    holder.batch_execute("COMMIT").await.expect("let the lock go");
    assert!(held_claim.await.is_some(), "the claim took its item once the lock was free");
    app.assert_consistent().await;
}
