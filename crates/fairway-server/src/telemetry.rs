//! Exports the broker's spans (target `fairway::traces`, see fairway_broker::traces) as
//! OpenTelemetry traces over OTLP/HTTP with protobuf, when `--otlp-endpoint` names a receiver.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use thiserror::Error;
use tracing::{Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::TraceArgs;
use fairway_broker::traces::TARGET;

/// The service name traces carry unless OTEL_SERVICE_NAME says another.
const SERVICE_NAME: &str = "fairway";

#[derive(Debug, Error)]
#[error("cannot export traces to {endpoint}: {reason}")]
pub struct TelemetryError {
    endpoint: String,
    reason: String,
}

/// A running trace exporter: a background thread that sends the spans ended meanwhile, in
/// batches.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// The exporter `args` asks for; None when it names no endpoint, and nothing runs.
    pub fn start(args: &TraceArgs) -> Result<Option<Self>, TelemetryError> {
        let Some(base) = &args.otlp_endpoint else {
            return Ok(None);
        };
        let endpoint = format!("{base}/v1/traces");
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(&endpoint)
            .build()
            .map_err(|error| TelemetryError {
                endpoint: endpoint.clone(),
                reason: error.to_string(),
            })?;
        let service_name =
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| SERVICE_NAME.to_owned());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(Resource::builder().with_service_name(service_name).build())
            .build();
        Ok(Some(Self { provider }))
    }

    /// The subscriber layer that turns the broker's spans, and only those, into the
    /// exporter's.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(SERVICE_NAME))
            .with_filter(Targets::new().with_target(TARGET, Level::INFO))
    }

    /// Sends what is still buffered and stops the exporter. It blocks until the receiver
    /// answered: call it off the async runtime's threads.
    pub fn shut_down(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "exporting the last traces failed");
        }
    }
}
