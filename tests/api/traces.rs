//! OpenTelemetry traces: a broker process started with --otlp-endpoint exports its spans to a
//! loopback OTLP receiver, and a job's W3C traceparent runs from the producer's submission
//! through the claim to the worker's report, and on to the worker's command.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{fresh_database, spawn_app};
use crate::shutdown::broker_process_with;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Every span an OTLP exporter sent to a receiver, as it decoded them.
type Received = Arc<Mutex<Vec<Span>>>;

/// A tiny OTLP/HTTP receiver on a loopback port: it decodes each `POST /v1/traces` body as an
/// `ExportTraceServiceRequest` and keeps its spans. Answers 400 to a body that is not one.
fn otlp_receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let kept = received.clone();
    let server = HttpServer::new(move || {
        let kept = kept.clone();
        App::new().route(
            "/v1/traces",
            web::post().to(move |body: web::Bytes| {
                let kept = kept.clone();
                async move {
                    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                        return HttpResponse::BadRequest().finish();
                    };
                    let spans = request.resource_spans.into_iter().flat_map(|resource| {
                        resource.scope_spans.into_iter().flat_map(|scope| scope.spans)
                    });
                    kept.lock().expect("spans").extend(spans);
                    HttpResponse::Ok().content_type("application/x-protobuf").finish()
                }
            }),
        )
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .expect("bind the receiver");
    let address = format!("http://{}", server.addrs()[0]);
    tokio::spawn(server.run());
    (address, received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A span's attribute as text, whatever its type.
fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|attribute| attribute.key == key)?;
    match value.value.as_ref()?.value.as_ref()? {
        AnyValue::StringValue(text) => Some(text.clone()),
        AnyValue::IntValue(number) => Some(number.to_string()),
        other => Some(format!("{other:?}")),
    }
}

/// Waits until the receiver holds a span named `name` in the test's trace.
async fn await_span(received: &Received, name: &str) -> Span {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = received
            .lock()
            .expect("spans")
            .iter()
            .find(|span| span.name == name && hex(&span.trace_id) == TRACE_ID)
            .cloned();
        if let Some(span) = found {
            return span;
        }
        let names: Vec<String> =
            received.lock().expect("spans").iter().map(|span| span.name.clone()).collect();
        assert!(Instant::now() < deadline, "no {name:?} span in the trace; received {names:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn one_trace_runs_from_the_submission_through_the_claim_to_the_report() {
    let (receiver, received) = otlp_receiver();
    let config = fresh_database().await;
    let env =
        [("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "50")];
    let (_broker, base) = broker_process_with(&config, Stdio::null(), &env).await;
    let http = reqwest::Client::new();

    let job = json!({
        "user": "alice",
        "steps": [{"service": "traced"}],
        "items": [{"payload": {"n": 1}}],
    });
    let submitted =
        http.post(format!("{base}/jobs")).header("traceparent", TRACEPARENT).json(&job).send();
    let submitted = submitted.await.expect("submit");
    assert_eq!(submitted.status(), StatusCode::CREATED);
    let claimed = http.get(format!("{base}/work?service=traced&querier=pod-1")).send().await;
    let claimed: Value = claimed.expect("claim").json().await.expect("claim JSON");
    let item = &claimed["work_items"][0];
    assert_eq!(item["traceparent"], TRACEPARENT, "the item carries the producer's trace");
    let report = json!({"status": "successful", "attempt": 1, "results": []});
    let reported = http.post(format!("{base}/work/{}/status", item["id"])).json(&report).send();
    assert_eq!(reported.await.expect("report").status(), StatusCode::OK);

    let request = await_span(&received, "POST /jobs").await;
    assert_eq!(
        hex(&request.parent_span_id),
        PRODUCER_SPAN,
        "the request continues the producer's span"
    );
    assert_eq!(attribute(&request, "http.route").as_deref(), Some("/jobs"));
    let submit = await_span(&received, "submit").await;
    assert_eq!(submit.parent_span_id, request.span_id, "the submission runs in its request");
    assert_eq!(attribute(&submit, "user").as_deref(), Some("alice"));
    let claim = await_span(&received, "claim batch").await;
    assert_eq!(hex(&claim.parent_span_id), PRODUCER_SPAN);
    assert_eq!(attribute(&claim, "batch_size").as_deref(), Some("1"));
    assert_eq!(attribute(&claim, "service").as_deref(), Some("traced"));
    let ending = await_span(&received, "ending batch").await;
    assert_eq!(hex(&ending.parent_span_id), PRODUCER_SPAN);
    assert_eq!(attribute(&ending, "batch_size").as_deref(), Some("1"));
    assert_eq!(attribute(&ending, "service").as_deref(), Some("traced"));

    // The claim's own request is a trace of its own, named by its route pattern.
    let claims_request =
        received.lock().expect("spans").iter().any(|span| span.name == "GET /work");
    assert!(claims_request, "every request has its span");
}

#[tokio::test]
async fn a_malformed_traceparent_is_refused_and_stores_nothing() {
    let app = spawn_app().await;
    let job = json!({"user": "alice", "steps": [{"service": "s"}], "items": [{"payload": {}}]});
    let answer = app
        .request(reqwest::Method::POST, "/jobs")
        .header("traceparent", "00-not-a-trace-01")
        .json(&job)
        .send()
        .await
        .expect("submit");
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    let body: Value = answer.json().await.expect("error JSON");
    assert_eq!(body["error"]["code"], "invalid_traceparent", "{body}");
    let jobs: i64 = app.db.query_one("SELECT count(*) FROM jobs", &[]).await.expect("count").get(0);
    assert_eq!(jobs, 0);
}

#[tokio::test]
async fn an_item_without_a_traceparent_has_no_such_field() {
    let app = spawn_app().await;
    app.submit_simple("alice", "untraced", 1, false).await;
    let item = app.claim("untraced").await.expect("an item");
    assert!(item.get("traceparent").is_none(), "{item}");
}
