use clap::Parser;
use fairway::config::{Cli, Command};

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(_) => {}
        Command::Postgres(args) => {
            let code = match fairway::db::embedded::run_command_with_postgres(&args).await {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("fairway: {error}");
                    1
                }
            };
            std::process::exit(code);
        }
    }
}
