//! TLS on both sides of the broker: a PostgreSQL that accepts only encrypted connections, as
//! managed services do, and HTTPS served by the broker itself to the API's clients, the CLI and
//! `fairway worker`. Every certificate is made here, by a CA that lives for one test.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant, SystemTime};

use fairway_devdb::EmbeddedPostgres;
use fairway_pg::Database;
use fairway_server::config::{ServeArgs, TlsArgs};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use reqwest::StatusCode;
use tokio::process::Command;
use uuid::Uuid;

use crate::helpers::{fresh_database, spawn_broker, spawn_broker_for, TestApp};

/// A certificate authority for one test, writing its files into a directory of its own.
struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

impl TestCa {
    fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, format!("fairway test CA {name}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a CA certificate");
        let ca = Self { issuer, dir: dir.to_owned(), name: name.to_owned() };
        std::fs::write(ca.root(), ca.issuer.pem()).expect("write the CA certificate");
        ca
    }

    /// The CA's certificate, the file a client trusts.
    fn root(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A server certificate for `names` (host names or IP addresses) and its key, as PEM.
    fn issue(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("server parameters");
        params.distinguished_name.push(DnType::CommonName, "fairway test server");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().expect("a server key");
        let certificate = params.signed_by(&key, &self.issuer).expect("a server certificate");
        (certificate.pem(), key.serialize_pem())
    }

    /// An HTTP client that trusts this CA alone.
    fn client(&self) -> reqwest::Client {
        let pem = std::fs::read(self.root()).expect("read the CA certificate");
        let root = reqwest::Certificate::from_pem(&pem).expect("a PEM certificate");
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(root)
            .build()
            .expect("an HTTPS client")
    }
}

/// A fresh directory that the PostgreSQL server's own user can read, as a server started by
/// root runs as `postgres`.
fn scratch_dir(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fairway-tls-{label}-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("make the scratch directory");
    dir
}

/// Writes `text` to `path` readable by its owner alone, owned by the PostgreSQL server's user
/// when the tests run as root: the server refuses a key anyone else may read.
fn write_for_server(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write a server file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    if nix::unistd::Uid::effective().is_root() {
        let user = nix::unistd::User::from_name("postgres").expect("look up postgres");
        let user = user.expect("a postgres system user");
        std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
            .expect("chown");
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// `fairway serve` on `database_url`, expected to fail at start-up; what it printed.
async fn serve_refused(database_url: &str, args: &[&str]) -> String {
    let output: Output = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(env!("CARGO_BIN_EXE_fairway"))
            .args(["serve", "--bind", "127.0.0.1:0"])
            .args(args)
            .env("DATABASE_URL", database_url)
            .env("FAIRWAY_NO_EMBEDDED_POSTGRES", "true")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the broker gives up within a minute")
    .expect("run fairway serve");
    assert!(!output.status.success(), "the broker started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn a_broker_reaches_a_postgresql_that_accepts_only_tls_and_says_why_when_refused() {
    let dir = scratch_dir("postgres");
    let ca = TestCa::new(&dir, "server");
    let (certificate, key) = ca.issue(&["127.0.0.1", "localhost"]);
    let (certificate_file, key_file, hba_file) =
        (dir.join("server.crt"), dir.join("server.key"), dir.join("pg_hba.conf"));
    write_for_server(&certificate_file, &certificate);
    write_for_server(&key_file, &key);
    write_for_server(
        &hba_file,
        "local all all trust\n\
         hostssl all all 127.0.0.1/32 trust\n\
         hostnossl all all 127.0.0.1/32 reject\n",
    );
    let port = free_port().to_string();
    let path = |file: &Path| file.to_str().expect("a UTF-8 path").to_owned();
    let _server = EmbeddedPostgres::start_with_settings(
        Some(&dir.join("data")),
        None,
        &[
            ("listen_addresses", "127.0.0.1"),
            ("port", &port),
            ("ssl", "on"),
            ("ssl_cert_file", &path(&certificate_file)),
            ("ssl_key_file", &path(&key_file)),
            ("hba_file", &path(&hba_file)),
        ],
    )
    .await
    .expect("start PostgreSQL with TLS")
    .ephemeral();
    let url = |tls: &str| format!("host=127.0.0.1 port={port} user=postgres dbname=postgres {tls}");

    // verify-full against the right CA: the broker serves, over encrypted connections only.
    let verified = url(&format!("sslmode=verify-full sslrootcert={}", ca.root().display()));
    let app =
        spawn_broker(ServeArgs::for_tests(), Database::parse(&verified).expect("parses")).await;
    app.submit_simple("alice", "svc", 2, true).await;
    for _ in 0..2 {
        let item = app.claim("svc").await.expect("an item over a TLS database");
        app.succeed(&item, serde_json::json!([])).await;
    }
    app.assert_consistent().await;
    let row = app
        .db
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.datname = current_database() AND a.backend_type = 'client backend'",
            &[],
        )
        .await
        .expect("read pg_stat_ssl");
    let (encrypted, plain): (i64, i64) = (row.get(0), row.get(1));
    assert!(encrypted >= 2 && plain == 0, "{encrypted} encrypted, {plain} plain connections");

    // disable: pg_hba refuses, and the broker says so in the server's words.
    let refused = serve_refused(&url("sslmode=disable"), &[]).await;
    assert!(
        refused.contains("pg_hba.conf rejects connection")
            && refused.contains("no encryption")
            && refused.contains("SQLSTATE 28000"),
        "{refused}"
    );

    // A CA file renewed in place is read again for the next connection: no restart.
    let other = TestCa::new(&dir, "other");
    let renewed = dir.join("renewed-ca.pem");
    std::fs::copy(other.root(), &renewed).expect("a CA file that does not fit yet");
    let database = url(&format!("sslmode=verify-full sslrootcert={}", renewed.display()));
    let database = Database::parse(&database).expect("parses");
    let refused = database.connect().await.err().map(|error| fairway_pg::describe(&error));
    assert!(refused.is_some_and(|error| error.contains("UnknownIssuer")));
    std::fs::copy(ca.root(), &renewed).expect("renew the CA file");
    let (client, connection) = database.connect().await.expect("the renewed CA is trusted");
    tokio::spawn(connection);
    client.simple_query("SELECT 1").await.expect("a query over the renewed trust");

    // verify-full against another CA: the certificate is refused, and the file is named.
    let other_root = other.root().display().to_string();
    let refused =
        serve_refused(&url(&format!("sslmode=verify-full sslrootcert={other_root}")), &[]).await;
    assert!(
        refused.contains("invalid peer certificate") && refused.contains(&other_root),
        "{refused}"
    );

    // A CA file that is not there is a start-up error naming it.
    let refused = serve_refused(&url("sslmode=verify-ca sslrootcert=/no/such/ca.pem"), &[]).await;
    assert!(refused.contains("sslrootcert /no/such/ca.pem"), "{refused}");
    drop(app);
    std::fs::remove_dir_all(&dir).ok();
}

/// Broker settings serving HTTPS with the certificate in `dir`.
fn https_args(dir: &Path) -> ServeArgs {
    let tls =
        TlsArgs { tls_cert: Some(dir.join("broker.crt")), tls_key: Some(dir.join("broker.key")) };
    ServeArgs { tls, ..ServeArgs::for_tests() }
}

/// Puts a certificate from `ca` for the loopback address where `https_args` reads it.
fn install_certificate(dir: &Path, ca: &TestCa) {
    let (certificate, key) = ca.issue(&["127.0.0.1"]);
    std::fs::write(dir.join("broker.crt"), certificate).expect("write the certificate");
    std::fs::write(dir.join("broker.key"), key).expect("write the key");
}

/// A broker serving HTTPS with a certificate from `ca`, whose helpers trust that CA.
async fn https_app(dir: &Path, ca: &TestCa) -> TestApp {
    install_certificate(dir, ca);
    spawn_broker_for(https_args(dir), fresh_database().await, ca.client()).await
}

/// Waits until a client trusting `ca` alone completes a handshake with `app`.
async fn await_certificate_from(app: &TestApp, ca: &TestCa, within: Duration) {
    let client = ca.client();
    let deadline = Instant::now() + within;
    loop {
        let answer = client.get(app.url("/readyz")).send().await;
        if answer.is_ok_and(|answer| answer.status() == StatusCode::OK) {
            return;
        }
        assert!(Instant::now() < deadline, "the broker still serves the old certificate");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_broker_serves_https_and_takes_a_rotated_certificate_without_a_restart() {
    let dir = scratch_dir("https");
    let (first, second) = (TestCa::new(&dir, "first"), TestCa::new(&dir, "second"));
    let app = https_app(&dir, &first).await;
    assert!(app.address.starts_with("https://"), "{}", app.address);
    app.submit_simple("alice", "svc", 1, true).await;
    let item = app.claim("svc").await.expect("an item over HTTPS");
    app.succeed(&item, serde_json::json!([])).await;

    // A client trusting only the system's roots refuses the certificate.
    let refused = reqwest::Client::new().get(app.url("/readyz")).send().await;
    let error = refused.expect_err("a certificate no system root signed");
    assert!(format!("{error:?}").contains("UnknownIssuer"), "{error:?}");

    // SIGHUP: the files now hold the second CA's certificate with their old modification times,
    // so that only the signal can have the broker read them again.
    let times: Vec<SystemTime> = ["broker.crt", "broker.key"]
        .iter()
        .map(|file| std::fs::metadata(dir.join(file)).and_then(|m| m.modified()).expect("mtime"))
        .collect();
    install_certificate(&dir, &second);
    for (file, time) in ["broker.crt", "broker.key"].iter().zip(times) {
        let file = std::fs::File::options().write(true).open(dir.join(file)).expect("open");
        file.set_modified(time).expect("keep the modification time");
    }
    nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGHUP)
        .expect("SIGHUP");
    await_certificate_from(&app, &second, Duration::from_secs(5)).await;

    // A changed file is noticed without a signal.
    install_certificate(&dir, &first);
    await_certificate_from(&app, &first, Duration::from_secs(30)).await;

    // A certificate file that is not there is a start-up error naming it.
    let database = fresh_database().await;
    let url = database.to_string();
    let refused = serve_refused(&url, &["--tls-cert", "/no/such.crt", "--tls-key", "/k"]).await;
    assert!(refused.contains("--tls-cert /no/such.crt"), "{refused}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn the_cli_and_a_worker_finish_a_job_over_https_trusting_the_ca_they_are_given() {
    let dir = scratch_dir("cli");
    let ca = TestCa::new(&dir, "broker");
    let app = https_app(&dir, &ca).await;
    let job = app.submit_simple("alice", "echo", 3, true).await;
    let fairway = |args: &[&str], ca_cert: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_fairway"));
        command.env("FAIRWAY_URL", &app.address).env_remove("FAIRWAY_TOKEN").args(args);
        match ca_cert {
            Some(path) => command.env("FAIRWAY_CA_CERT", path),
            None => command.env_remove("FAIRWAY_CA_CERT"),
        };
        command.kill_on_drop(true);
        command
    };
    let worker_args = ["worker", "--service", "echo", "--querier", "tls-pod", "--wait", "1s"];
    // The one result is the item itself, as the command read it on standard input.
    let script = r#"printf '[%s]' "$(cat)""#;
    let worker_command = [&worker_args[..], &["--", "sh", "-c", script]].concat();

    // Without the CA both refuse, saying what to trust, and the worker does not retry forever.
    let output = fairway(&["admin", "services"], None).output().await.expect("run");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("is not trusted"), "{said}");
    assert!(said.contains("FAIRWAY_CA_CERT"), "{said}");
    let output =
        tokio::time::timeout(Duration::from_secs(30), fairway(&worker_command, None).output())
            .await
            .expect("the worker gives up")
            .expect("run the worker");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("is not trusted"), "{said}");

    // With it, the CLI reads and the worker finishes the job.
    let root = ca.root();
    let output = fairway(&["admin", "services"], Some(&root)).output().await.expect("run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("echo"));
    let mut worker = fairway(&worker_command, Some(&root))
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the worker");
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.job(job).await["status"] != "successful" {
        assert!(Instant::now() < deadline, "the worker never finished the job over HTTPS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = nix::unistd::Pid::from_raw(worker.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    assert!(worker.wait().await.expect("the worker exits").success());
    std::fs::remove_dir_all(&dir).ok();
}
