//! The dashboard in a real headless Chromium, driven over WebDriver (chromedriver), against a
//! live broker with seeded work: what each page shows equals what the API says. A screenshot of
//! each page goes to `target/ui-screenshots/`.
//!
//! Without Chromium or chromedriver on the machine these tests are reported as ignored (see
//! build.rs), or fail when `FAIRWAY_REQUIRE_TOOLS` is set, as `make test` sets it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

use crate::helpers::{spawn_app, spawn_app_with_auth, TestApp};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium session, and the chromedriver that drives it.
struct Browser {
    client: Client,
    _driver: Child,
}

impl Browser {
    /// Starts the browser; a test not ignored for lack of one fails when it is missing.
    async fn start() -> Self {
        let missing: Vec<&str> =
            [CHROMIUM, CHROMEDRIVER].into_iter().filter(|path| !Path::new(path).exists()).collect();
        assert!(
            missing.is_empty(),
            "the browser tests need {} (Debian: apt-get install chromium chromium-driver)",
            missing.join(" and ")
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900"],
            }
        });
        let capabilities = match capabilities {
            Value::Object(map) => map,
            _ => unreachable!("an object literal"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = loop {
            match ClientBuilder::native()
                .capabilities(capabilities.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => break client,
                Err(error) => {
                    assert!(Instant::now() < deadline, "chromedriver never answered: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        Self { client, _driver: driver }
    }

    /// Opens a page of the dashboard (`jobs`, or `jobs/<id>` for what it shows) and waits until
    /// it has drawn itself from the API.
    async fn open(&self, app: &TestApp, address: &str) {
        // A fresh document each time, so that `data-loaded` speaks of this page's first draw.
        self.client.goto("about:blank").await.expect("blank");
        self.client.goto(&app.url(&format!("/ui/#{address}"))).await.expect("open the page");
        self.await_loaded(address.split('/').next().unwrap_or(address)).await;
    }

    async fn await_loaded(&self, page: &str) {
        let selector = format!("body[data-loaded='{page}']");
        self.client
            .wait()
            .at_most(Duration::from_secs(15))
            .for_element(Locator::Css(&selector))
            .await
            .unwrap_or_else(|error| panic!("the {page} page never drew itself: {error}"));
    }

    /// The text of every cell of a table's body, row by row.
    async fn table(&self, selector: &str) -> Vec<Vec<String>> {
        let script = "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]
                          .map(tr => [...tr.children].map(td => td.textContent));";
        let value = self.client.execute(script, vec![json!(selector)]).await.expect("read table");
        serde_json::from_value(value).expect("rows of strings")
    }

    /// The rows of a table once `done` holds for them, or a failure naming `what` after 15 s.
    async fn await_table(
        &self,
        selector: &str,
        what: &str,
        done: impl Fn(&[Vec<String>]) -> bool,
    ) -> Vec<Vec<String>> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let rows = self.table(selector).await;
            if done(&rows) {
                return rows;
            }
            assert!(Instant::now() < deadline, "{what} never showed: {rows:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of a shown element once it contains `wanted`, or a failure after 15 s.
    async fn await_text(&self, selector: &str, wanted: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let script = "const e = document.querySelector(arguments[0]);
                          return e && !e.hidden && !e.closest('[hidden]') ? e.textContent : '';";
            let value =
                self.client.execute(script, vec![json!(selector)]).await.expect("read the text");
            let text = value.as_str().unwrap_or_default().to_owned();
            if text.contains(wanted) {
                return text;
            }
            assert!(Instant::now() < deadline, "{selector} never said {wanted:?}: {text:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn click(&self, selector: &str) {
        let element = self.client.find(Locator::Css(selector)).await;
        element.unwrap_or_else(|error| panic!("{selector}: {error}")).click().await.expect("click");
    }

    async fn type_into(&self, selector: &str, text: &str) {
        let element = self.client.find(Locator::Css(selector)).await;
        element
            .unwrap_or_else(|error| panic!("{selector}: {error}"))
            .send_keys(text)
            .await
            .expect("type");
    }

    async fn choose(&self, selector: &str, value: &str) {
        let element = self.client.find(Locator::Css(selector)).await;
        let select = element.unwrap_or_else(|error| panic!("{selector}: {error}"));
        select.select_by_value(value).await.expect("choose an option");
    }

    async fn screenshot(&self, name: &str) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot folder");
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(dir.join(format!("{name}.png")), png).expect("write the screenshot");
    }

    async fn close(self) {
        self.client.close().await.expect("close the browser");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_tenants_page_shows_the_apis_tenants_and_queriers() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    app.http
        .put(app.url("/admin/tenants/acme"))
        .json(&json!({ "max_queriers": 1, "max_outstanding": 500 }))
        .send()
        .await
        .expect("set a tenant");
    app.submit(json!({ "user": "bob", "tenant": "acme", "steps": [{ "service": "q" }],
                       "items": [{ "payload": 1 }, { "payload": 2 }] }))
        .await;
    app.claim_with("service=q&querier=pod-a").await;

    browser.open(&app, "tenants").await;
    let tenants: Value = app.get("/admin/tenants").await.json().await.expect("JSON");
    let shown = browser.table("#tenant-list").await;
    assert_eq!(shown.len(), tenants["tenants"].as_array().map_or(0, Vec::len));
    let acme = shown.iter().find(|row| row[0] == "acme").expect("acme is listed");
    assert_eq!(acme[1..4], ["1", "500", "1"], "limits and waiting items: {shown:?}");
    assert_eq!(acme[10], "every querier", "one querier: the shard is all of them");
    let default = shown.iter().find(|row| row[0] == "default").expect("default is listed");
    assert_eq!(default[1..3], ["all", "unlimited"], "0 means no limit: {shown:?}");
    let queriers = browser.table("#querier-list").await;
    assert_eq!(queriers[0][..3], ["pod-a", "active", "1"], "{queriers:?}");
    browser.screenshot("tenants").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_users_page_shows_the_user_work_rows_and_filters_them() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    app.submit_simple("alice", "subsetter", 3, false).await;
    app.submit_simple("bob", "subsetter", 2, true).await;
    app.submit_simple("carol", "concat", 1, true).await;
    app.claim("subsetter").await.expect("an item");

    browser.open(&app, "users").await;
    let shown = browser.table("#user-work").await;
    let rows: Value = app.get("/admin/user-work").await.json().await.expect("JSON");
    let expected: Vec<Vec<String>> = rows["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            ["user", "service", "ready_count", "running_count"]
                .iter()
                .map(|key| row[key].to_string().trim_matches('"').to_owned())
                .collect()
        })
        .collect();
    let shown_columns: Vec<Vec<String>> = shown
        .iter()
        .map(|row| vec![row[0].clone(), row[2].clone(), row[6].clone(), row[7].clone()])
        .collect();
    assert_eq!(shown_columns, expected, "the page shows the API's rows");
    browser.screenshot("users").await;

    let service = browser.client.find(Locator::Css("#users-filter input[name=service]")).await;
    service.expect("filter field").send_keys("concat").await.expect("type");
    browser
        .client
        .find(Locator::Css("#users-filter button"))
        .await
        .expect("filter button")
        .click()
        .await
        .expect("filter");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = browser.table("#user-work").await;
        if shown.len() == 1 && shown[0][0] == "carol" {
            break;
        }
        assert!(Instant::now() < deadline, "the filter never applied: {shown:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_fair_share_chart_draws_one_series_per_active_user() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    for user in ["alice", "bob", "carol"] {
        app.submit_simple(user, "svc", 4, true).await;
    }
    // Three claims: one running item each, so each holds a third of the workers.
    app.claim_with("service=svc&querier=pod-0&max=3").await;

    browser.open(&app, "shares").await;
    let users: Vec<String> = browser
        .client
        .execute(
            "return [...document.querySelectorAll('#share-chart polyline.series')]
                 .map(line => line.dataset.user);",
            vec![],
        )
        .await
        .map(|value| serde_json::from_value(value).expect("names"))
        .expect("read the chart");
    assert_eq!(users, ["alice", "bob", "carol"], "a series per active user");
    // Each user holds a third of the running items; wait for a few samples to draw it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let heights: Vec<Vec<f64>> = browser
            .client
            .execute(
                "return [...document.querySelectorAll('#share-chart polyline.series')]
                     .map(line => line.getAttribute('points').split(' ')
                                      .map(point => Number(point.split(',')[1])));",
                vec![],
            )
            .await
            .map(|value| serde_json::from_value(value).expect("numbers"))
            .expect("read the chart");
        if heights.iter().all(|points| points.len() >= 3) {
            let third = 300.0 - 30.0 - (300.0 - 60.0) / 3.0;
            for points in &heights {
                assert!(points.iter().all(|y| (y - third).abs() < 1.0), "{heights:?}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "the chart never took three samples");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    browser.screenshot("fair-share").await;
    browser.close().await;
}

/// Sets a policy with `PUT path` (`/admin/users/ann`, `/admin/tenants/acme`).
async fn put_policy(app: &TestApp, path: &str, body: Value) {
    let response = app.request(reqwest::Method::PUT, path).json(&body).send().await.expect("PUT");
    assert_eq!(response.status(), 200, "PUT {path} {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_fair_share_page_shows_entitled_and_actual_shares_limits_and_who_is_held_back() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    // Weights 1 and 3: alice is entitled to a quarter of svc's workers, bob to three quarters;
    // but alice may run one item at a time.
    put_policy(&app, "/admin/users/alice", json!({ "weight": 1, "max_running": 1 })).await;
    put_policy(
        &app,
        "/admin/users/bob",
        json!({ "weight": 3, "rate_per_second": 50, "burst": 20 }),
    )
    .await;
    // carol, alone on another service, gets one item in about seventeen minutes, and her
    // tenant runs one item at a time.
    put_policy(&app, "/admin/users/carol", json!({ "rate_per_second": 0.001, "burst": 1 })).await;
    put_policy(
        &app,
        "/admin/tenants/acme",
        json!({ "weight": 2, "tier": 1, "max_running": 1, "rate_per_second": 5, "burst": 2 }),
    )
    .await;
    app.submit_simple("alice", "svc", 12, true).await;
    app.submit_simple("bob", "svc", 12, true).await;
    app.submit(json!({ "user": "carol", "tenant": "acme", "is_async": true,
                       "steps": [{ "service": "other" }], "items": [{}, {}, {}] }))
        .await;
    let claimed = app.claim_with("service=svc&querier=pod-0&max=10").await;
    assert_eq!(claimed.len(), 10, "bob takes what alice's cap leaves");
    assert_eq!(claimed.iter().filter(|item| item["user"] == "alice").count(), 1, "her cap");
    assert_eq!(app.claim_with("service=other&querier=pod-1&max=3").await.len(), 1);

    browser.open(&app, "shares/svc").await;
    // Columns: user, weight, tier, entitled share, actual share, running, ready, max running,
    // rate limit, state. Entitled: 1 and 3 of 4; actual: 1 and 9 of the 10 running items.
    let shown = browser.await_table("#share-table", "both users", |rows| rows.len() == 2).await;
    assert_eq!(
        shown,
        [
            ["bob", "3", "3", "75 %", "90 %", "9", "3", "none", "50/s, burst 20", ""],
            ["alice", "1", "3", "25 %", "10 %", "1", "11", "1", "none", "at cap"],
        ],
        "the users most running first"
    );
    let legend = browser.await_text("#share-legend", "entitled").await;
    assert_eq!(legend, "bob 90 % (entitled 75 %)alice 10 % (entitled 25 %)");
    // The entitled shares are drawn too: a dashed line across the chart at each.
    let levels: Vec<(String, f64)> = browser
        .client
        .execute(
            "return [...document.querySelectorAll('#share-chart line.entitled')]
                 .map(line => [line.dataset.user, Number(line.getAttribute('y1'))]);",
            vec![],
        )
        .await
        .map(|value| serde_json::from_value(value).expect("users and heights"))
        .expect("read the chart");
    let at = |share: f64| 300.0 - 30.0 - share * (300.0 - 60.0);
    assert_eq!(levels, [("bob".to_owned(), at(0.75)), ("alice".to_owned(), at(0.25))]);
    let service = browser.table("#service-policy").await;
    assert_eq!(service, [["svc", "10", "none", "none", ""]], "svc has no policy of its own");
    browser.screenshot("fair-share-policies").await;

    // carol has had her one item: out of tokens, not at a cap of her own.
    browser.open(&app, "shares/other").await;
    let shown = browser.await_table("#share-table", "carol", |rows| rows.len() == 1).await;
    assert_eq!(
        shown,
        [[
            "carol",
            "1",
            "3",
            "100 %",
            "100 %",
            "1",
            "2",
            "none",
            "0.001/s, burst 1",
            "rate-limited"
        ]]
    );

    // Her tenant is at its cap of one running item.
    browser.open(&app, "tenants").await;
    // Columns: tenant, max queriers, max outstanding, outstanding, weight, tier, running, max
    // running, rate limit, state, served by.
    let tenants = browser.table("#tenant-list").await;
    let acme = tenants.iter().find(|row| row[0] == "acme").expect("acme is listed");
    assert_eq!(acme[4..10], ["2", "1", "1", "1", "5/s, burst 2", "at cap"], "{tenants:?}");
    let default = tenants.iter().find(|row| row[0] == "default").expect("default is listed");
    assert_eq!(default[4..10], ["1", "3", "10", "none", "none", ""], "{tenants:?}");
    browser.screenshot("tenants-policies").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_jobs_page_finds_a_users_job_shows_it_and_pauses_it() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    let job = app.submit_simple("dora", "svc", 3, true).await;
    app.claim("svc").await.expect("an item");

    browser.open(&app, "jobs").await;
    let recent = browser.table("#job-list").await;
    assert_eq!(recent.first().map(|row| row[0].clone()), Some(job.to_string()), "recent jobs");
    let find = |selector: &'static str| browser.client.find(Locator::Css(selector));
    find("#job-find input[name=user]")
        .await
        .expect("user field")
        .send_keys("dora")
        .await
        .expect("type");
    find("#job-find button").await.expect("find button").click().await.expect("find");
    // The list of recent jobs already holds the job: wait for the user's list to replace it.
    browser
        .client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath("//h3[@id='job-list-title' and text()=\"dora's jobs\"]"))
        .await
        .expect("dora's jobs are listed");
    let link = browser
        .client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::LinkText(&job.to_string()))
        .await
        .expect("the user's job is listed");
    link.click().await.expect("open the job");
    browser
        .client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath("//b[@id='job-status' and text()='running']"))
        .await
        .expect("the job's status is shown");
    let shown_actions = || async {
        let script = "return [...document.querySelectorAll('#job-detail button[data-action]')]
                          .filter(b => !b.hidden).map(b => b.dataset.action);";
        let value = browser.client.execute(script, vec![]).await.expect("read the buttons");
        serde_json::from_value::<Vec<String>>(value).expect("names")
    };
    assert_eq!(shown_actions().await, ["pause", "cancel"], "a running job can't be resumed");
    let document = app.job(job).await;
    let steps = browser.table("#job-steps").await;
    let step = &document["steps"][0];
    assert_eq!(
        steps[0][1..7],
        [
            step["service"].as_str().expect("service").to_owned(),
            step["total"].to_string(),
            step["ready"].to_string(),
            step["scheduled"].to_string(),
            step["running"].to_string(),
            step["successful"].to_string(),
        ],
        "the step's counts are the API's"
    );
    // The items come in a request of their own, after the job's status.
    browser
        .client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#job-items tbody tr"))
        .await
        .expect("the job's items are shown");
    let items = browser.table("#job-items").await;
    assert_eq!(items.len(), 3, "{items:?}");
    assert_eq!(items.iter().filter(|row| row[2] == "running").count(), 1, "{items:?}");
    browser.screenshot("jobs").await;

    find("#job-detail button[data-action=pause]")
        .await
        .expect("pause")
        .click()
        .await
        .expect("click");
    browser.client.accept_alert().await.expect("confirm the pause");
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.job(job).await["status"] != "paused" {
        assert!(Instant::now() < deadline, "the job was never paused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    browser
        .client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::XPath("//b[@id='job-status' and text()='paused']"))
        .await
        .expect("the page shows the pause");
    assert_eq!(shown_actions().await, ["resume", "cancel"], "a paused job can't be paused");
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_overview_shows_each_services_queue_as_the_api_does() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    app.submit_simple("alice", "subsetter", 5, true).await;
    app.submit_simple("bob", "concat", 2, true).await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    app.submit(json!({ "user": "carol", "steps": [{ "service": "concat" }],
                       "items": [{}, {}, {}], "not_before": later }))
        .await;
    app.claim("subsetter").await.expect("an item");

    browser.open(&app, "overview").await;
    let services: Value = app.get("/admin/services").await.json().await.expect("JSON");
    let expected: Vec<Vec<String>> = services["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|service| {
            ["service", "ready", "scheduled", "running", "paused"]
                .iter()
                .map(|key| service[key].to_string().trim_matches('"').to_owned())
                .collect()
        })
        .collect();
    assert_eq!(
        expected,
        [["concat", "2", "3", "0", "0"], ["subsetter", "4", "0", "1", "0"]],
        "the API counts the seeded work"
    );
    let shown: Vec<Vec<String>> =
        browser.table("#services").await.into_iter().map(|row| row[..5].to_vec()).collect();
    assert_eq!(shown, expected, "the page shows the API's numbers");
    // concat has ready work no worker asked for; subsetter's worker asked a moment ago.
    let asked: Vec<String> =
        browser.table("#services").await.into_iter().map(|row| row[8].clone()).collect();
    assert_eq!(asked[0], "never: no worker", "{asked:?}");
    assert!(asked[1].ends_with("s ago") && !asked[1].contains("no worker"), "{asked:?}");
    browser.screenshot("overview").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn with_auth_on_the_dashboard_asks_for_a_token_and_keeps_it_for_the_session_only() {
    let browser = Browser::start().await;
    let app = spawn_app_with_auth().await;
    app.http
        .put(app.url("/admin/tenants/acme"))
        .bearer_auth(app.token.as_deref().expect("the admin token"))
        .json(&json!({ "max_queriers": 0, "max_outstanding": 7 }))
        .send()
        .await
        .expect("set a tenant");
    let made: Value = app
        .post("/admin/tokens", &json!({ "role": "reader", "name": "dashboard" }))
        .await
        .json()
        .await
        .expect("JSON");
    let reader = made["token"].as_str().expect("a token");

    // No token yet: the API answers 401, and the page asks for one.
    browser.client.goto(&app.url("/ui/#tenants")).await.expect("open the page");
    let prompt = browser
        .client
        .wait()
        .at_most(Duration::from_secs(15))
        .for_element(Locator::Css("body[data-needs-token='true'] #token-form:not([hidden])"))
        .await
        .expect("the dashboard asks for a token");
    browser.screenshot("token-prompt").await;

    // A token that is not one is refused, and the page says so.
    let input = prompt.find(Locator::Css("#token-input")).await.expect("the token field");
    input.send_keys("fw_not-a-token").await.expect("type");
    prompt.find(Locator::Css("button")).await.expect("button").click().await.expect("submit");
    browser
        .client
        .wait()
        .at_most(Duration::from_secs(15))
        .for_element(Locator::Css("#token-error:not([hidden])"))
        .await
        .expect("the refusal is shown");

    // The reader token: the page draws itself from the API.
    let input = browser.client.find(Locator::Css("#token-input")).await.expect("the token field");
    input.send_keys(reader).await.expect("type");
    browser
        .client
        .find(Locator::Css("#token-form button"))
        .await
        .expect("button")
        .click()
        .await
        .expect("submit");
    browser.await_loaded("tenants").await;
    let shown = browser.table("#tenant-list").await;
    let acme = shown.iter().find(|row| row[0] == "acme").expect("acme is listed");
    assert_eq!(acme[2], "7", "{shown:?}");
    assert!(browser.client.find(Locator::Css("#token-form[hidden]")).await.is_ok());

    // Kept in this tab's session storage only: not in localStorage, not in a cookie.
    let kept = browser
        .client
        .execute(
            "return [sessionStorage.getItem('fairway-token'), Object.keys(localStorage).length, document.cookie];",
            vec![],
        )
        .await
        .expect("read the storage");
    assert_eq!(kept, json!([reader, 0, ""]));

    // A new session (a new tab's storage is empty) is asked again.
    browser.client.execute("sessionStorage.clear();", vec![]).await.expect("clear");
    browser.client.goto("about:blank").await.expect("blank");
    browser.client.goto(&app.url("/ui/#overview")).await.expect("open the page");
    browser
        .client
        .wait()
        .at_most(Duration::from_secs(15))
        .for_element(Locator::Css("body[data-needs-token='true']"))
        .await
        .expect("asked again");
    browser.close().await;
}

/// Fails `item` for good, with `error`.
async fn fail_for_good(app: &TestApp, item: &Value, error: &str) {
    let failure = json!({ "status": "failed", "attempt": item["attempt"], "error": error,
                          "retryable": false });
    let response = app.report(item, failure).await;
    assert_eq!(response.status(), 200, "fail item {item}");
}

/// The ids of a job's items of `status`, through the API.
async fn item_ids(app: &TestApp, job: uuid::Uuid, status: &str) -> Vec<String> {
    let page: Value =
        app.get(&format!("/jobs/{job}/items?status={status}")).await.json().await.expect("JSON");
    page["items"].as_array().expect("items").iter().map(|item| item["id"].to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_jobs_page_pages_a_jobs_items_shows_their_errors_and_retries_them() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    // 21 items: one more than a page. Two fail for good, the rest succeed.
    let job = app.submit_simple("erin", "svc", 21, true).await;
    let items = app.claim_with("service=svc&querier=pod-0&max=21").await;
    assert_eq!(items.len(), 21);
    for (n, item) in items.iter().enumerate() {
        match n {
            3 => fail_for_good(&app, item, "granule G3 is corrupt").await,
            17 => fail_for_good(&app, item, "granule G17 timed out").await,
            _ => app.succeed(item, json!([format!("out-{n}")])).await,
        }
    }
    let failed = item_ids(&app, job, "failed").await;
    assert_eq!(failed.len(), 2);

    browser.open(&app, &format!("jobs/{job}")).await;
    let first_page =
        browser.await_table("#job-items", "a full page of items", |rows| rows.len() == 20).await;
    browser.click("#items-next").await;
    let last_page =
        browser.await_table("#job-items", "the last item", |rows| rows.len() == 1).await;
    assert!(first_page.iter().all(|row| row[0] != last_page[0][0]), "pages don't overlap");
    browser.click("#items-first").await;
    browser.await_table("#job-items", "the first page again", |rows| rows.len() == 20).await;

    browser.choose("#item-filter select[name=status]", "failed").await;
    let shown = browser
        .await_table("#job-items", "the failed items", |rows| {
            rows.len() == 2 && rows.iter().all(|row| row[2] == "failed")
        })
        .await;
    let ids: Vec<String> = shown.iter().map(|row| row[0].clone()).collect();
    assert_eq!(ids, failed, "the API's failed items");
    let errors: Vec<&str> = shown.iter().map(|row| row[4].as_str()).collect();
    assert_eq!(errors, ["granule G3 is corrupt", "granule G17 timed out"]);
    browser.screenshot("job-failed-items").await;

    browser.click("#job-detail button[data-action=retry]").await;
    browser.client.accept_alert().await.expect("confirm the retry");
    browser.await_text("#job-message", "2 failed items are ready again").await;
    assert_eq!(item_ids(&app, job, "ready").await, failed, "the failed items are ready again");
    assert!(item_ids(&app, job, "failed").await.is_empty());
    browser.await_table("#job-items", "no failed item", |rows| rows.is_empty()).await;
    browser.choose("#item-filter select[name=status]", "ready").await;
    let ready = browser
        .await_table("#job-items", "the retried items", |rows| {
            rows.len() == 2 && rows.iter().all(|row| row[2] == "ready")
        })
        .await;
    assert_eq!(ready.iter().map(|row| row[0].clone()).collect::<Vec<_>>(), failed);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn the_jobs_page_counts_and_lists_items_waiting_for_their_time() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let job = app
        .submit(json!({ "user": "gina", "steps": [{ "service": "svc" }],
                        "items": [{}, {}, {}], "not_before": later }))
        .await;
    let scheduled = item_ids(&app, job, "scheduled").await;
    assert_eq!(scheduled.len(), 3);

    browser.open(&app, &format!("jobs/{job}")).await;
    // Columns: step, service, total, ready, scheduled, running.
    let steps = browser
        .await_table("#job-steps", "the step's counts", |rows| {
            rows.first().is_some_and(|row| row.len() > 5)
        })
        .await;
    assert_eq!(steps[0][2..6], ["3", "0", "3", "0"], "total, ready, scheduled, running");
    browser.choose("#item-filter select[name=status]", "scheduled").await;
    let shown = browser
        .await_table("#job-items", "the scheduled items", |rows| {
            rows.len() == 3 && rows.iter().all(|row| row[2] == "scheduled")
        })
        .await;
    assert_eq!(shown.iter().map(|row| row[0].clone()).collect::<Vec<_>>(), scheduled);
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn a_refused_retry_shows_the_apis_reason_and_changes_nothing() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    let job = app.submit_simple("frank", "svc", 2, true).await;
    let item = app.claim("svc").await.expect("an item");
    fail_for_good(&app, &item, "bad input").await;
    let canceled = app.post(&format!("/jobs/{job}/cancel"), &json!({})).await;
    assert_eq!(canceled.status(), 200);

    browser.open(&app, &format!("jobs/{job}")).await;
    browser.await_text("#job-status", "canceled").await;
    // The reaper retires the canceled job's idle queue in its own time: not between the two.
    app.await_idle_tenant_queues_retired().await;
    let before = app.fingerprint_apart_from_tenant_hints().await;
    browser.click("#job-detail button[data-action=retry]").await;
    browser.client.accept_alert().await.expect("confirm the retry");
    let said = browser.await_text("#job-message", "retry refused").await;
    assert!(said.contains("it was canceled") && said.contains("409, job_canceled"), "{said}");
    assert_eq!(
        app.fingerprint_apart_from_tenant_hints().await,
        before,
        "a refused retry changes nothing"
    );
    browser.screenshot("job-retry-refused").await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn a_bulk_action_on_the_filtered_jobs_asks_with_their_count_and_only_then_acts() {
    let browser = Browser::start().await;
    let app = spawn_app().await;
    let mut matching = Vec::new();
    for _ in 0..3 {
        matching.push(app.submit_simple("gail", "svc-a", 1, true).await);
    }
    let others = [
        app.submit_simple("gail", "svc-b", 1, true).await,
        app.submit_simple("hank", "svc-a", 1, true).await,
    ];

    browser.open(&app, "jobs").await;
    browser.type_into("#job-find input[name=user]", "gail").await;
    browser.type_into("#job-find input[name=service]", "svc-a").await;
    browser.choose("#job-find select[name=status]", "accepted").await;
    browser.click("#job-find button").await;
    browser.await_text("#job-list-title", "gail's accepted jobs on service svc-a").await;
    let listed =
        browser.await_table("#job-list", "gail's svc-a jobs", |rows| rows.len() == 3).await;
    let newest_first: Vec<String> = matching.iter().rev().map(ToString::to_string).collect();
    assert_eq!(listed.iter().map(|row| row[0].clone()).collect::<Vec<_>>(), newest_first);

    let before = app.fingerprint_apart_from_tenant_hints().await;
    browser.choose("#bulk select[name=action]", "pause").await;
    browser.click("#bulk button").await;
    let question = browser.await_text("#bulk-question", "Pause 3 jobs?").await;
    assert!(question.contains("gail's accepted jobs on service svc-a"), "{question}");
    browser.await_text("#bulk-yes", "Yes, pause 3 jobs").await;
    browser.screenshot("bulk-confirmation").await;
    browser.click("#bulk-no").await;
    browser.await_text("#bulk-result", "Nothing was changed.").await;
    assert_eq!(
        app.fingerprint_apart_from_tenant_hints().await,
        before,
        "counting and going back change nothing"
    );
    for job in matching.iter().chain(&others) {
        assert_eq!(app.job(*job).await["status"], "accepted");
    }

    browser.click("#bulk button").await;
    browser.await_text("#bulk-question", "Pause 3 jobs?").await;
    browser.click("#bulk-yes").await;
    browser.await_text("#bulk-result", "pause: 3 jobs matched, 3 changed.").await;
    for job in &matching {
        assert_eq!(app.job(*job).await["status"], "paused", "{job}");
    }
    for job in &others {
        assert_eq!(app.job(*job).await["status"], "accepted", "{job} is not gail's on svc-a");
    }
    // The list follows: no accepted job of gail's on svc-a is left.
    browser.await_table("#job-list", "an empty list", |rows| rows.is_empty()).await;
    app.assert_consistent().await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_browser, ignore = "needs /usr/bin/chromium and /usr/bin/chromedriver")]
async fn a_reader_tokens_bulk_action_is_refused_with_the_reason() {
    let browser = Browser::start().await;
    let app = spawn_app_with_auth().await;
    let job =
        app.submit(json!({ "user": "ivy", "steps": [{ "service": "svc" }], "items": [{}] })).await;
    let made: Value = app
        .post("/admin/tokens", &json!({ "role": "reader", "name": "dashboard" }))
        .await
        .json()
        .await
        .expect("JSON");
    let reader = made["token"].as_str().expect("a token");

    browser.client.goto(&app.url("/ui/#jobs")).await.expect("open the page");
    browser.type_into("#token-input", reader).await;
    browser.click("#token-form button").await;
    browser.await_loaded("jobs").await;
    browser.type_into("#job-find input[name=user]", "ivy").await;
    browser.click("#job-find button").await;
    browser.await_table("#job-list", "ivy's job", |rows| rows.len() == 1).await;
    let before = app.fingerprint_apart_from_tenant_hints().await;
    browser.choose("#bulk select[name=action]", "cancel").await;
    browser.click("#bulk button").await;
    let said = browser.await_text("#bulk-result", "cancel refused").await;
    assert!(said.contains("403"), "{said}");
    assert!(browser.client.find(Locator::Css("#bulk-confirm[hidden]")).await.is_ok());
    assert_eq!(
        app.fingerprint_apart_from_tenant_hints().await,
        before,
        "a refused bulk action changes nothing"
    );
    assert_eq!(app.job(job).await["status"], "accepted");
    browser.close().await;
}
