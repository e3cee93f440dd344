//! The broker's OpenTelemetry spans: a claim batch, an ending batch and a submission each make
//! one, under their own target, so that they cost nothing unless an exporter is listening
//! (`fairway serve --otlp-endpoint`; docs/operating.md). A batch serves requests of several
//! jobs at once: it continues the trace of one of those jobs, and links the others.

use std::collections::{BTreeSet, HashMap};

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

use crate::db::sql::{self, row, statement};
use crate::error::BrokerError;
use fairway_api::traceparent::TraceParent;

statement! {
    /// The traceparents of the jobs a claim batch handed out items of, for those that have one.
    JobTraceparents<'a> = "job_traceparents" -> JobTraceparent {
        job_ids: &'a [Uuid],
    }
}

row! {
    /// A job's W3C traceparent.
    JobTraceparent {
        job_id: Uuid,
        traceparent: String,
    }
}

/// The target of every span meant for the trace exporter: the log leaves it out.
pub const TARGET: &str = "fairway::traces";

/// The span context a W3C traceparent names, as a remote parent; None for a malformed one.
pub fn remote_span_context(traceparent: &str) -> Option<SpanContext> {
    let parent = TraceParent::parse(traceparent).ok()?;
    let flags = if parent.sampled() { TraceFlags::SAMPLED } else { TraceFlags::default() };
    Some(SpanContext::new(
        TraceId::from_hex(parent.trace_id()).ok()?,
        SpanId::from_hex(parent.span_id()).ok()?,
        flags,
        true,
        TraceState::default(),
    ))
}

/// Makes `span`, not yet entered, continue the trace of one of `traceparents` (the first in
/// their order, so the same every time) and links it to the others, each once. Does nothing
/// to a span no exporter records.
pub fn continue_traces<'a>(span: &Span, traceparents: impl IntoIterator<Item = &'a str>) {
    if span.is_disabled() {
        return;
    }
    let distinct: BTreeSet<&str> = traceparents.into_iter().collect();
    let mut contexts = distinct.into_iter().filter_map(remote_span_context);
    if let Some(first) = contexts.next() {
        // The span was never entered, so its parent may still change.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(first));
    }
    for other in contexts {
        span.add_link(other);
    }
}

/// The traceparents of those of `job_ids` that have one, by job.
pub(crate) async fn job_traceparents(
    client: &impl deadpool_postgres::GenericClient,
    job_ids: &[Uuid],
) -> Result<HashMap<Uuid, String>, BrokerError> {
    let rows = sql::fetch_all(client, &JobTraceparents { job_ids }).await?;
    Ok(rows
        .into_iter()
        .map(|JobTraceparent { job_id, traceparent }| (job_id, traceparent))
        .collect())
}
