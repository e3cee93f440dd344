//! The fair order's server functions tested in SQL: pg_prove runs every pgTAP file of
//! `tests/sql/` against a fresh database holding the schema and functions, so that each pick of
//! the order, each counter an ending moves and each drift the recounts find is checked where the
//! functions run, without a broker in between.
//!
//! pg_prove and the pgtap extension are required: without them this test fails, naming the
//! Debian packages that bring them.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tokio::process::Command;
use tokio_postgres::config::{Host, SslMode};

use crate::helpers::{connect, fresh_database};

#[tokio::test]
async fn the_order_functions_pass_their_pgtap_tests() {
    let database = fresh_database().await;
    let client = connect(&database).await;
    if let Err(error) = client.batch_execute("CREATE EXTENSION pgtap").await {
        let major: i32 = client
            .query_one("SELECT current_setting('server_version_num')::integer / 10000", &[])
            .await
            .map(|row| row.get(0))
            .unwrap_or(15);
        panic!(
            "the pgTAP tests need the pgtap extension on the test server (PostgreSQL {major}), \
             and CREATE EXTENSION pgtap failed: {}. On Debian: apt-get install \
             postgresql-{major}-pgtap libtap-parser-sourcehandler-pgtap-perl",
            fairway_pg::describe(&error)
        );
    }

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("tests/sql"))
        .expect("read tests/sql")
        .map(|entry| entry.expect("a tests/sql entry").path())
        .filter(|path| path.extension() == Some(OsStr::new("sql")))
        .map(|path| path.strip_prefix(root).expect("below the root").to_path_buf())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "tests/sql holds no .sql file");

    // pg_prove's --dbname cannot carry a connection string (it splits it at `=`), so the
    // connection goes by libpq's environment, which psql reads. The files find the statements
    // they read from the repository root.
    let config = database.config();
    let mut command = Command::new("pg_prove");
    command.current_dir(root).args(["--norc", "--nocolor", "--verbose"]).args(&files);
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            Host::Tcp(name) => name.clone(),
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    if !hosts.is_empty() {
        command.env("PGHOST", hosts.join(","));
    }
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    if !ports.is_empty() {
        command.env("PGPORT", ports.join(","));
    }
    if let Some(user) = config.get_user() {
        command.env("PGUSER", user);
    }
    if let Some(password) = config.get_password() {
        command.env("PGPASSWORD", OsStr::from_bytes(password));
    }
    let mode = match config.get_ssl_mode() {
        SslMode::Disable => "disable",
        SslMode::Require => "require",
        _ => "prefer",
    };
    command.env("PGSSLMODE", mode);
    command.env("PGDATABASE", config.get_dbname().expect("the test database's name"));
    // The functions under test live in this build's schema, as a broker's connections see them.
    let search_path = fairway_broker::db::functions::search_path();
    command.env("PGOPTIONS", format!("-c search_path={search_path}"));

    let output = match command.output().await {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
            "the pgTAP tests need pg_prove, which is not on PATH. On Debian: apt-get install \
             libtap-parser-sourcehandler-pgtap-perl postgresql-15-pgtap"
        ),
        Err(error) => panic!("cannot run pg_prove: {error}"),
    };
    assert!(
        output.status.success(),
        "pg_prove {}:\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
