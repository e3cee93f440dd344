//! The deployment in k8s/ and the Dockerfile, tied to the binary they run: each overlay renders
//! with Debian's kubectl kustomize and validates (tests/validate_manifests.py: kubernetes-validate
//! in strict mode, the custom resources against the vendored CRDs), and what the manifests name
//! (environment variables, probe paths and ports, metrics) is what `fairway serve` reads, serves
//! and exports.

use fairway_server::config::ServeArgs;
use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{spawn_app_with, TestApp};
use crate::metrics::{scrape_until, Scrape};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn tool(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| format!("{MANIFEST_DIR}/{default}"))
}

/// The objects `kubectl kustomize k8s/<dir>` renders, once the validator passed them all.
async fn render(dir: &str) -> Vec<Value> {
    let python = tool("FAIRWAY_TEST_PYTHON", "target/pytools/bin/python");
    let kubectl = tool("FAIRWAY_TEST_KUBECTL", "target/kubernetes-client/usr/bin/kubectl");
    let output = tokio::process::Command::new(&python)
        .arg(format!("{MANIFEST_DIR}/tests/validate_manifests.py"))
        .arg(&kubectl)
        .arg(format!("{MANIFEST_DIR}/k8s/{dir}"))
        .output()
        .await
        .unwrap_or_else(|error| panic!("run {python} ({error}); `make test` sets it up"));
    assert!(
        output.status.success(),
        "k8s/{dir} does not render or validate:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("rendered objects as JSON")
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind && o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(name))
        })
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
}

/// Every environment variable `fairway <command> --help` lists.
async fn env_vars(command: &str) -> BTreeSet<String> {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
        .args([command, "--help"])
        .output()
        .await
        .expect("fairway serve --help");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    // `[env: NAME=value]`, or `[env: NAME]` for a secret whose value help hides.
    help.split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(['=', ']']).next().map(str::to_owned))
        .collect()
}

/// `name{label="value",…}` inside a PromQL query, as a metric name and its label matchers.
fn selector(query: &str, name: &str) -> Vec<(String, String)> {
    let start = query.find(&format!("{name}{{")).unwrap_or_else(|| panic!("{name} in {query}"));
    let rest = &query[start + name.len() + 1..];
    let inside = &rest[..rest.find('}').expect("closing brace")];
    inside
        .split(',')
        .map(|matcher| {
            let (label, value) = matcher.split_once('=').expect("label=\"value\"");
            (label.trim().to_owned(), value.trim().trim_matches('"').to_owned())
        })
        .collect()
}

fn has_series(scraped: &Scrape, name: &str, labels: &[(String, String)]) -> bool {
    let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    scraped.value(name, &labels).is_some()
}

/// A broker with ready items of service `example`, the one the example worker serves, where
/// an item was claimed and finished and a lease expired, so that every metric has a series.
async fn example_broker() -> (TestApp, Scrape) {
    let mut args = ServeArgs::for_tests();
    args.metrics.metrics_refresh = Duration::ZERO;
    args.lease = Duration::from_millis(300);
    args.reap_interval = Duration::from_millis(100);
    let app = spawn_app_with(args).await;
    app.submit_simple("someone", "example", 3, true).await;
    let item = app.claim("example").await.expect("an item");
    app.succeed(&item, serde_json::json!([])).await;
    app.claim("example").await.expect("an item to let expire");
    let scraped = scrape_until(&app, "an expired lease", |scraped| {
        let labels = [("service", "example")];
        scraped.value("fairway_lease_expirations_total", &labels) == Some(1.0)
            && scraped.value("fairway_queue_wait_seconds_count", &labels).is_some()
    })
    .await;
    (app, scraped)
}

#[tokio::test]
#[cfg_attr(
    fairway_no_kubectl,
    ignore = "needs target/pytools and kubectl (make test installs them)"
)]
async fn each_overlay_validates_and_names_what_the_broker_reads_serves_and_exports() {
    let worker_env = env_vars("worker").await;
    let env_vars = env_vars("serve").await;
    assert!(env_vars.contains("FAIRWAY_LOG_FORMAT") && env_vars.contains("DATABASE_URL"));
    let (app, scraped) = example_broker().await;
    let exported: BTreeSet<&str> = scraped.0.iter().map(|sample| sample.name.as_str()).collect();

    for (overlay, brokers, instances) in [("overlays/dev", 1, 1), ("overlays/production", 3, 3)] {
        let objects = render(overlay).await;
        let deployment = find(&objects, "Deployment", "fairway-broker");
        assert_eq!(deployment["spec"]["replicas"], brokers, "{overlay}");
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];

        // Every variable the broker is given is one it reads, or one that another's value expands
        // (`$(NAME)`, which Kubernetes substitutes).
        let mut given: Vec<String> = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| e["name"].as_str().unwrap_or_default().to_owned())
            .collect();
        let mut config = None;
        for source in container["envFrom"].as_array().into_iter().flatten() {
            let name = source["configMapRef"]["name"].as_str().expect("a ConfigMap");
            let map = find(&objects, "ConfigMap", name);
            given.extend(map["data"].as_object().expect("data").keys().cloned());
            config = Some(map);
        }
        let values: Vec<&str> = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["value"].as_str())
            .collect();
        for name in &given {
            let expanded = values.iter().any(|value| value.contains(&format!("$({name})")));
            assert!(
                env_vars.contains(name) || expanded,
                "{overlay}: {name} is not in `fairway serve --help`"
            );
        }
        let config = &config.expect("the broker's ConfigMap")["data"];
        assert_eq!(config["FAIRWAY_LOG_FORMAT"], "json");

        // The port it binds is the port the probes, the Service and the ServiceMonitor use.
        assert_eq!(strings(&container["args"]), ["--bind", "0.0.0.0:8080"]);
        let port = &container["ports"][0];
        assert_eq!(
            (port["name"].as_str(), port["containerPort"].as_u64()),
            (Some("http"), Some(8080))
        );
        for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
            assert_eq!(container[probe]["httpGet"]["path"], path, "{overlay} {probe}");
            assert_eq!(container[probe]["httpGet"]["port"], "http", "{overlay} {probe}");
            assert_eq!(app.get(path).await.status(), StatusCode::OK, "{path}");
        }
        let service = find(&objects, "Service", "fairway-broker");
        assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
        let monitor = find(&objects, "ServiceMonitor", "fairway-broker");
        let endpoint = &monitor["spec"]["endpoints"][0];
        assert_eq!(
            (endpoint["port"].as_str(), endpoint["path"].as_str()),
            (Some("http"), Some("/metrics"))
        );

        // The pod outlives the broker's own drain: the preStop hook's pause, then
        // --shutdown-timeout. The hook is the broker's /prestop, on its own port.
        let seconds = |name: &str| {
            let text = config[name].as_str().unwrap_or_else(|| panic!("{overlay}: no {name}"));
            humantime::parse_duration(text).expect("a duration").as_secs()
        };
        let (timeout, pause) =
            (seconds("FAIRWAY_SHUTDOWN_TIMEOUT"), seconds("FAIRWAY_PRESTOP_DELAY"));
        let hook = &container["lifecycle"]["preStop"]["httpGet"];
        assert_eq!((&hook["path"], &hook["port"]), (&json!("/prestop"), &json!("http")), "{hook}");
        let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("grace period");
        assert!(grace > pause + timeout, "{overlay}: {grace} s of grace for {pause} + {timeout} s");

        // Non-root, no privilege escalation, no capabilities, nothing written to its image.
        let security = &container["securityContext"];
        assert_eq!(security["allowPrivilegeEscalation"], false);
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);

        // The autoscaler's metric is one the broker exports, with those labels.
        let scaled = find(&objects, "ScaledObject", "example-worker");
        let target = scaled["spec"]["scaleTargetRef"]["name"].as_str().expect("target");
        find(&objects, "Deployment", target);
        let trigger = &scaled["spec"]["triggers"][0];
        assert_eq!(trigger["type"], "prometheus");
        let query = trigger["metadata"]["query"].as_str().expect("query");
        let labels = selector(query, "fairway_work_items");
        assert!(has_series(&scraped, "fairway_work_items", &labels), "{query} matches nothing");

        // Every metric an alert reads is exported.
        let rules = find(&objects, "PrometheusRule", "fairway");
        for rule in rules["spec"]["groups"][0]["rules"].as_array().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr");
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("fairway_") {
                    assert!(
                        exported.contains(word),
                        "{} reads {word}, not exported",
                        rule["alert"]
                    );
                }
            }
        }

        // The example worker runs `fairway worker`, with variables it reads.
        let worker = &find(&objects, "Deployment", "example-worker")["spec"]["template"]["spec"];
        let worker = &worker["containers"][0];
        assert_eq!(strings(&worker["command"])[1..3], ["worker", "--"]);
        for variable in worker["env"].as_array().expect("env") {
            let name = variable["name"].as_str().expect("name");
            assert!(worker_env.contains(name), "{name} is not in `fairway worker --help`");
        }

        let database = find(&objects, "Cluster", "fairway-db");
        assert_eq!(database["spec"]["instances"], instances, "{overlay}");
        // DATABASE_URL is the URL CloudNativePG writes for cluster fairway-db, given as
        // DATABASE_APP_URI (Kubernetes expands only a variable defined before), with TLS
        // verified against the cluster's CA appended.
        let env = container["env"].as_array().expect("env");
        let position = |name: &str| {
            env.iter()
                .position(|variable| variable["name"] == name)
                .unwrap_or_else(|| panic!("{overlay}: the broker has no {name}"))
        };
        let (uri_at, url_at) = (position("DATABASE_APP_URI"), position("DATABASE_URL"));
        assert!(uri_at < url_at, "{overlay}: DATABASE_URL expands DATABASE_APP_URI, defined after");
        let secret = &env[uri_at]["valueFrom"]["secretKeyRef"];
        assert_eq!(
            secret["name"], "fairway-db-app",
            "the broker reads the URL CloudNativePG writes for cluster fairway-db"
        );
        // The app Secret's `uri` names the read-write Service, fairway-db-rw, which follows
        // the primary through a failover; a broker on a replica would only answer 503.
        assert_eq!(secret["key"], "uri", "{overlay}: the URL through fairway-db-rw");
        let url = env[url_at]["value"].as_str().expect("DATABASE_URL's value");
        let (base, query) = url.split_once('?').expect("DATABASE_URL's query string");
        assert_eq!(base, "$(DATABASE_APP_URI)", "{overlay}: {url}");
        let param =
            |key: &str| query.split('&').find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='));
        assert_eq!(param("sslmode"), Some("verify-full"), "{overlay}: {url}");
        // sslrootcert is a file in a volume the broker mounts: the ca.crt of the CA CloudNativePG
        // made for fairway-db, and nothing else of that Secret (it holds the CA's key too).
        let root = param("sslrootcert").unwrap_or_else(|| panic!("{overlay}: no sslrootcert"));
        let (mount, file) = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|mount| {
                let dir = mount["mountPath"].as_str()?.trim_end_matches('/');
                Some((mount, root.strip_prefix(dir)?.strip_prefix('/')?))
            })
            .unwrap_or_else(|| panic!("{overlay}: {root} is in no volume the broker mounts"));
        assert_eq!(mount["readOnly"], true, "{overlay}");
        let volume = pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|volume| volume["name"] == mount["name"])
            .unwrap_or_else(|| panic!("{overlay}: no volume {}", mount["name"]));
        assert_eq!(volume["secret"]["secretName"], "fairway-db-ca", "{overlay}");
        let items = volume["secret"]["items"].as_array().expect("items: ca.crt alone");
        assert!(
            items.iter().all(|item| item["key"] == "ca.crt")
                && items.iter().any(|item| item["path"] == file),
            "{overlay}: {root} is not fairway-db-ca's ca.crt alone"
        );
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz", "{overlay}");

        // Bound to 0.0.0.0, the broker needs auth: its admin token comes from a Secret, as the
        // worker's and the consistency check's tokens do (docs/security.md).
        let secret_of = |env: &Value, name: &str| {
            env.as_array()
                .into_iter()
                .flatten()
                .find(|variable| variable["name"] == name)
                .and_then(|variable| variable["valueFrom"]["secretKeyRef"]["name"].as_str())
                .map(str::to_owned)
        };
        assert_eq!(
            secret_of(&container["env"], "FAIRWAY_ADMIN_TOKEN").as_deref(),
            Some("fairway-admin-token"),
            "{overlay}"
        );
        assert_eq!(
            secret_of(&worker["env"], "FAIRWAY_TOKEN").as_deref(),
            Some("fairway-worker-token"),
            "{overlay}"
        );
        let check = &find(&objects, "CronJob", "fairway-consistency")["spec"]["jobTemplate"]
            ["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            secret_of(&check["env"], "FAIRWAY_TOKEN").as_deref(),
            Some("fairway-reader-token"),
            "{overlay}"
        );
        let command = strings(&check["command"]).join(" ");
        assert!(command.contains("Authorization: Bearer $FAIRWAY_TOKEN"), "{command}");
    }
    let production = render("overlays/production").await;
    let database = &find(&production, "Cluster", "fairway-db")["spec"];
    assert_eq!(database["postgresql"]["synchronous"]["number"], 1);
    assert!(database["backup"]["barmanObjectStore"].is_object());
    find(&production, "ScheduledBackup", "fairway-db");

    let hpa = render("autoscaling/hpa").await;
    let metric = &find(&hpa, "HorizontalPodAutoscaler", "example-worker")["spec"]["metrics"][0];
    let name = metric["external"]["metric"]["name"].as_str().expect("metric");
    let labels: Vec<(String, String)> = metric["external"]["metric"]["selector"]["matchLabels"]
        .as_object()
        .expect("labels")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
        .collect();
    assert!(has_series(&scraped, name, &labels), "the HPA's {name} {labels:?} matches nothing");
}

/// The image runs `fairway serve` on the port the manifests use, as a non-root user, without a
/// PostgreSQL of its own; its dependency layer builds on a stub of every target Cargo.toml names.
#[tokio::test]
async fn the_dockerfile_runs_the_broker_the_manifests_expect() {
    let dockerfile =
        std::fs::read_to_string(format!("{MANIFEST_DIR}/Dockerfile")).expect("Dockerfile");
    let line = |start: &str| {
        dockerfile
            .lines()
            .rfind(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no {start}"))
            .to_owned()
    };
    assert_eq!(line("ENTRYPOINT"), r#"ENTRYPOINT ["/usr/local/bin/fairway", "serve"]"#);
    assert_eq!(line("CMD"), r#"CMD ["--bind", "0.0.0.0:8080"]"#);
    assert_eq!(line("EXPOSE"), "EXPOSE 8080");
    let user = line("USER");
    assert!(!["USER root", "USER 0", "USER 0:0"].contains(&user.as_str()), "{user}");
    let env = line("ENV");
    assert_eq!(env, "ENV FAIRWAY_NO_EMBEDDED_POSTGRES=true");
    assert!(env_vars("serve").await.contains("FAIRWAY_NO_EMBEDDED_POSTGRES"));

    let manifest: String =
        std::fs::read_to_string(format!("{MANIFEST_DIR}/Cargo.toml")).expect("Cargo.toml");
    let stubs =
        dockerfile.lines().find(|l| l.contains("touch tests/")).expect("the test stubs' line");
    for path in manifest.lines().filter_map(|l| l.strip_prefix("path = ")) {
        let path = path.trim_matches('"');
        assert!(stubs.contains(path), "the Dockerfile's dependency layer has no stub for {path}");
    }
    let crates = std::fs::read_dir(format!("{MANIFEST_DIR}/crates")).expect("crates/");
    for entry in crates {
        let name = entry.expect("a crate").file_name().into_string().expect("a UTF-8 name");
        let copy = format!("COPY crates/{name}/Cargo.toml crates/{name}/");
        assert!(dockerfile.contains(&copy), "the dependency layer does not copy {name}'s manifest");
    }
    let version = |text: &str, key: &str| {
        text.split(key).nth(1).and_then(|rest| {
            let digits: String = rest
                .chars()
                .skip_while(|c| !c.is_ascii_digit())
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = digits.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            Some((parts.next()?, parts.next()?))
        })
    };
    let builder = version(&dockerfile, "FROM rust:").expect("the build stage's Rust");
    let needed = version(&manifest, "rust-version").expect("rust-version");
    assert!(builder >= needed, "the image builds with Rust {builder:?}, fairway needs {needed:?}");
}
