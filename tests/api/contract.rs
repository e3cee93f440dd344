//! The OpenAPI document is valid, and a live broker honours it: Schemathesis generates requests
//! for every operation from the document and checks each answer against it.
//!
//! The tools come from the Python environment `make test` prepares (`target/pytools`). Run
//! without it (a bare `cargo test`), these tests are reported as ignored (see build.rs), or
//! fail when `FAIRWAY_REQUIRE_TOOLS` is set, as `make test` sets it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fairway_server::config::ServeArgs;
use tokio::process::Command;

use crate::helpers::{auth_args, spawn_app, spawn_app_with, ADMIN_TOKEN};

/// The installed tool `name`, beside the Python `FAIRWAY_TEST_PYTHON` names; a test not
/// ignored for lack of it fails when it is missing.
fn python_tool(name: &str) -> PathBuf {
    let python = crate::metrics::python();
    let path = Path::new(&python).parent().unwrap_or(Path::new(".")).join(name);
    assert!(path.exists(), "{} is missing: `make test` installs it", path.display());
    path
}

#[tokio::test]
#[cfg_attr(fairway_no_pytools, ignore = "needs target/pytools (make test installs it)")]
async fn the_openapi_document_is_valid() {
    let validator = python_tool("openapi-spec-validator");
    let app = spawn_app().await;
    let document = app.get("/openapi.json").await.text().await.expect("the document");
    let file = std::env::temp_dir().join(format!("fairway-openapi-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&file, &document).expect("write the document");
    let output = Command::new(validator).arg(&file).output().await.expect("run the validator");
    std::fs::remove_file(&file).ok();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(fairway_no_pytools, ignore = "needs target/pytools (make test installs it)")]
async fn the_broker_answers_as_its_openapi_document_says() {
    let schemathesis = python_tool("st");
    // Long polls are cut to a second, so that generated `wait`s do not hold the run up. Auth
    // is on: every request carries the admin token (tests/api/auth.rs checks the answers
    // without one). Revoking is left out: a generated id could revoke the very token the run
    // uses (tests/api/auth.rs revokes).
    let app =
        spawn_app_with(ServeArgs { long_poll_max: Duration::from_secs(1), ..auth_args() }).await;
    let output = Command::new(schemathesis)
        .args(["run", &app.url("/openapi.json")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,\
             content_type_conformance,response_schema_conformance",
        ])
        .args(["--header", &format!("Authorization: Bearer {ADMIN_TOKEN}")])
        .args(["--exclude-path", "/admin/tokens/{id}/revoke"])
        .args(["--max-examples", "100", "--seed", "1", "--workers", "2"])
        // No examples kept from earlier runs: replayed against a changed document they make a
        // seeded run depend on what ran before it.
        .args(["--generation-database", "none"])
        // Not the coverage phase: under Python 3.11 it now and then crashes inside Hypothesis
        // ("AST constructor recursion depth mismatch") before sending a request. Fuzzing and the
        // stateful phase still send every operation generated and boundary cases.
        .args(["--phases", "examples,fuzzing,stateful"])
        .env("NO_COLOR", "1")
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .expect("run schemathesis");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{report}{}", String::from_utf8_lossy(&output.stderr));
    assert!(report.contains("Tested: "), "{report}");
}
