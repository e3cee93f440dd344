//! Exports the broker's spans (target `fairway::traces`, see fairway_broker::traces) as
//! OpenTelemetry traces over OTLP/HTTP with protobuf, when `--otlp-endpoint` names a receiver.

use opentelemetry::trace::TracerProvider as _;
use std::path::Path;
use std::time::Duration;

use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use thiserror::Error;
use tracing::{Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::TraceArgs;
use fairway_broker::traces::TARGET;

/// How long one export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter's HTTP client, trusting the system's roots and those in `ca_cert`. It is built
/// on a thread of its own: a blocking client must not be made on the async runtime's threads.
fn http_client(ca_cert: Option<&Path>) -> Result<reqwest::blocking::Client, String> {
    let mut builder = reqwest::blocking::Client::builder().timeout(EXPORT_TIMEOUT);
    if let Some(path) = ca_cert {
        let pem = std::fs::read(path)
            .map_err(|error| format!("cannot read --ca-cert {}: {error}", path.display()))?;
        let roots = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|error| format!("--ca-cert {} is not PEM: {error}", path.display()))?;
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
    }
    std::thread::spawn(move || builder.build().map_err(|error| error.to_string()))
        .join()
        .unwrap_or_else(|_| Err("building the HTTP client panicked".to_owned()))
}

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
        let failed = |reason: String| TelemetryError { endpoint: endpoint.clone(), reason };
        let http = http_client(args.otlp_ca_cert.as_deref()).map_err(failed)?;
        let exporter = SpanExporter::builder()
            .with_http()
            .with_http_client(http)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(&endpoint)
            .build()
            .map_err(|error| failed(error.to_string()))?;
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
