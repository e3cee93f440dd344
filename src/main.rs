//! The one `fairway` binary: parses the command line and hands each subcommand to the crate
//! that owns it (see the crate map in README.md).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use fairway_bench::args::BenchArgs;
use fairway_chaos::args::{ChaosArgs, ChaosDriveArgs};
use fairway_client::args::{AdminArgs, DemoArgs, SubmitArgs, WorkerArgs};
use fairway_devdb::{DatabaseArgs, PostgresArgs};
use fairway_server::config::ServeArgs;
use fairway_server::startup::Application;
use fairway_server::telemetry::Traces;

/// The database the private server holds the broker's tables in.
const EMBEDDED_DATABASE: &str = "fairway";

#[derive(Debug, Parser)]
#[command(name = "fairway", version, about = "A fair-queueing work broker on PostgreSQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,

    /// How log lines are written to standard output: `text`, for people (coloured only on a
    /// terminal), or `json`, one object per line, for a cluster's log collector.
    #[arg(long, global = true, env = "FAIRWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the broker's HTTP server.
    Serve(ServeCommand),
    /// Start the private PostgreSQL server, run COMMAND with DATABASE_URL pointing at it, then
    /// stop the server (and, with --ephemeral, delete its data directory).
    Postgres(PostgresArgs),
    /// Measure claim throughput, latency and fairness of the broker beside baseline claim
    /// paths, on a freshly seeded database, and write the results.
    Bench(BenchArgs),
    /// Look into and steer a running broker over its HTTP API.
    Admin(AdminArgs),
    /// Submit a job to a running broker.
    Submit(SubmitArgs),
    /// Serve a service by running a command per work item: any executable becomes a worker.
    Worker(WorkerArgs),
    /// Show fair sharing on a running broker: three users arrive one after another while
    /// `fairway worker` pods serve them, and each user's share of the workers is drawn as SVG.
    Demo(DemoArgs),
    /// Test tooling: the fault suite (`make chaos`) or, with --soak, the steady-load soak run
    /// (`make soak`). See docs/reliability.md.
    #[command(hide = true)]
    Chaos(ChaosArgs),
    /// Test tooling: the fault suite's worker process, which `fairway chaos` starts.
    #[command(hide = true, name = "chaos-drive")]
    ChaosDrive(ChaosDriveArgs),
}

/// `fairway serve`: where the database is, and how the broker runs on it.
#[derive(Debug, Args)]
struct ServeCommand {
    #[command(flatten)]
    database: DatabaseArgs,

    #[command(flatten)]
    serve: ServeArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    // The release and the schema this build carries, as `fairway --version` prints them: a
    // string made once, for the life of the process.
    let version: &'static str = Box::leak(fairway_broker::db::build_description().into_boxed_str());
    let cli = match Cli::from_arg_matches(&Cli::command().version(version).get_matches()) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    let traces = match &cli.command {
        Command::Serve(command) => match Traces::start(&command.serve.traces) {
            Ok(traces) => traces,
            Err(error) => {
                eprintln!("fairway: {error}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    subscriber(cli.log_format, traces.as_ref()).init();
    let outcome = match cli.command {
        Command::Serve(command) => serve(command).await,
        Command::Bench(args) => fairway_bench::run(args).await.map_err(|error| error.to_string()),
        Command::Postgres(args) => match fairway_devdb::run_command_with_postgres(&args).await {
            Ok(code) => return ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(error) => Err(error.to_string()),
        },
        Command::Admin(args) => {
            fairway_client::cli::admin(args).await.map_err(|error| error.to_string())
        }
        Command::Submit(args) => {
            fairway_client::cli::submit(args).await.map_err(|error| error.to_string())
        }
        Command::Worker(args) => {
            fairway_client::cli::worker(args).await.map_err(|error| error.to_string())
        }
        Command::Demo(args) => {
            fairway_client::cli::demo(args).await.map_err(|error| error.to_string())
        }
        Command::Chaos(args) => fairway_chaos::run(args).await.map_err(|error| error.to_string()),
        Command::ChaosDrive(args) => {
            fairway_chaos::drive(args).await.map_err(|error| error.to_string())
        }
    };
    if let Some(traces) = traces {
        // Sending the last spans blocks on the receiver's answer.
        let _ = tokio::task::spawn_blocking(move || traces.shut_down()).await;
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fairway: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(command: ServeCommand) -> Result<(), String> {
    let ServeCommand { database, serve: args } = command;
    // The port first: a taken port is the one error to report, not what the database says.
    let listener = fairway_server::startup::bind(&args).map_err(|error| error.to_string())?;
    let (database, private_server) = fairway_devdb::connect_or_start(&database, EMBEDDED_DATABASE)
        .await
        .map_err(|error| error.to_string())?;
    let served = async {
        // Where it tried, and with which TLS settings, beside why it failed.
        let target = database.to_string();
        let app = Application::build_on(listener, &args, database)
            .await
            .map_err(|error| format!("{error} (database: {target})"))?;
        let scheme = if args.tls.tls_cert.is_some() { "https" } else { "http" };
        let base = format!("{scheme}://{}", args.bind);
        tracing::info!(
            address = %args.bind,
            "fairway is serving: the dashboard at {base}/ui/, the API's docs at {base}/docs/"
        );
        app.run_until_stopped().await.map_err(|error| error.to_string())
    }
    .await;
    if let Some(server) = private_server {
        if let Err(error) = server.stop().await {
            tracing::warn!(%error, "stopping the private PostgreSQL server failed");
        }
    }
    served
}

/// The log, and the trace exporter's layer when there is one. The exporter's spans stay out of
/// the log whatever RUST_LOG says; with no exporter no layer wants them, so they are never
/// made, and neither is the work done only to fill them in.
fn subscriber(
    log_format: LogFormat,
    traces: Option<&Traces>,
) -> impl tracing::Subscriber + Send + Sync {
    let logs = tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal());
    let logs = match log_format {
        LogFormat::Text => logs.boxed(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).boxed(),
    };
    // By default without the driver's relayed server notices (a migration table that already
    // exists) and the migration library's own lines, which the broker logs once itself.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,tokio_postgres=warn,refinery_core=warn"));
    let filter = filter.add_directive(
        format!("{}=off", fairway_broker::traces::TARGET).parse().expect("a valid directive"),
    );
    // A list rather than an Option: a `None` layer counts as wanting every span.
    let mut layers = vec![logs.with_filter(filter).boxed()];
    layers.extend(traces.map(|traces| traces.layer().boxed()));
    tracing_subscriber::registry().with(layers)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::{subscriber, Cli, LogFormat};

    #[test]
    fn every_flag_is_well_formed_and_unique() {
        Cli::command().debug_assert();
    }

    #[test]
    fn without_an_exporter_the_exporters_spans_are_never_made() {
        tracing::subscriber::with_default(subscriber(LogFormat::Text, None), || {
            let span = tracing::info_span!(target: fairway_broker::traces::TARGET, "claim batch");
            assert!(span.is_disabled(), "a span no one exports was made");
            assert!(!tracing::info_span!("a logged span").is_disabled());
        });
    }
}
