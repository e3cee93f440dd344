use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use fairway::config::{Cli, Command, LogFormat, ServeArgs};
use fairway::db::embedded;
use fairway::startup::Application;
use tracing_subscriber::EnvFilter;

/// The database the private server holds the broker's tables in.
const EMBEDDED_DATABASE: &str = "fairway";

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_ansi(std::io::stdout().is_terminal());
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(false).init(),
    }
    let outcome = match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Bench(args) => fairway::bench::run(args).await.map_err(|error| error.to_string()),
        Command::Postgres(args) => match embedded::run_command_with_postgres(&args).await {
            Ok(code) => return ExitCode::from(u8::try_from(code).unwrap_or(1)),
            Err(error) => Err(error.to_string()),
        },
        Command::Admin(args) => fairway::cli::admin(args).await.map_err(|error| error.to_string()),
        Command::Submit(args) => {
            fairway::cli::submit(args).await.map_err(|error| error.to_string())
        }
        Command::Worker(args) => {
            fairway::cli::worker(args).await.map_err(|error| error.to_string())
        }
        Command::Demo(args) => fairway::cli::demo(args).await.map_err(|error| error.to_string()),
        Command::Chaos(args) => fairway::chaos::run(args).await.map_err(|error| error.to_string()),
        Command::ChaosDrive(args) => {
            fairway::chaos::drive(args).await.map_err(|error| error.to_string())
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fairway: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let (database, private_server) =
        fairway::db::connect_or_start(&args.database, EMBEDDED_DATABASE)
            .await
            .map_err(|error| error.to_string())?;
    let served = async {
        let app = Application::build(&args, database).await.map_err(|error| error.to_string())?;
        tracing::info!(address = %args.bind, "fairway is serving");
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
