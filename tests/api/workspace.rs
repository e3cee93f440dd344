//! The workspace's arrows, read from `cargo metadata`: the product never depends on its tools,
//! the broker knows neither HTTP nor the command line, and a Rust worker that embeds the client
//! compiles neither actix nor a PostgreSQL driver. And the broker's rooms, read from its
//! source: each duty keeps its statements in its own folder and reads no other duty's, and
//! what it installs into the database sits in the workspace's `sql/`, in a folder named like
//! the duty.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// Each workspace crate's name, with the names of the packages it depends on as a normal (not
/// dev or build) dependency, directly and through others.
struct Graph {
    direct: BTreeMap<String, BTreeSet<String>>,
    reachable: BTreeMap<String, BTreeSet<String>>,
}

/// The workspace's graph, read once for every test here.
fn graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(read_graph)
}

/// The triple of the machine building: only its platform's dependencies count (and only they
/// are downloaded).
fn host() -> String {
    let output = Command::new("rustc").arg("-vV").output().expect("rustc -vV runs");
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let host = text.lines().find_map(|line| line.strip_prefix("host: "));
    host.expect("rustc names its host").to_owned()
}

fn read_graph() -> Graph {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--filter-platform", &host()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let name_of: BTreeMap<&str, &str> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|package| {
            (package["id"].as_str().expect("id"), package["name"].as_str().expect("name"))
        })
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in metadata["resolve"]["nodes"].as_array().expect("resolve nodes") {
        let from = name_of[node["id"].as_str().expect("id")].to_owned();
        let normal = node["deps"].as_array().expect("deps").iter().filter(|dep| {
            dep["dep_kinds"]
                .as_array()
                .expect("dep_kinds")
                .iter()
                .any(|kind| kind["kind"].is_null())
        });
        let to = normal.map(|dep| name_of[dep["pkg"].as_str().expect("pkg")].to_owned());
        edges.entry(from).or_default().extend(to);
    }
    let members: Vec<String> = metadata["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .map(|id| name_of[id.as_str().expect("id")].to_owned())
        .collect();
    let mut reachable = BTreeMap::new();
    for member in &members {
        let mut seen = BTreeSet::new();
        let mut next: Vec<&String> = edges[member].iter().collect();
        while let Some(package) = next.pop() {
            if seen.insert(package.clone()) {
                next.extend(edges.get(package).into_iter().flatten());
            }
        }
        reachable.insert(member.clone(), seen);
    }
    let direct = members.iter().map(|member| (member.clone(), edges[member].clone())).collect();
    Graph { direct, reachable }
}

fn assert_none(crate_name: &str, deps: &BTreeSet<String>, forbidden: &[&str]) {
    let found: Vec<&&str> = forbidden.iter().filter(|name| deps.contains(**name)).collect();
    assert!(found.is_empty(), "{crate_name} depends on {found:?}");
}

const TOOLS: [&str; 3] = ["fairway-devdb", "fairway-bench", "fairway-chaos"];

#[test]
fn the_product_never_depends_on_its_tools() {
    let graph = graph();
    for product in ["fairway-api", "fairway-broker", "fairway-server", "fairway-client"] {
        assert_none(product, &graph.reachable[product], &TOOLS);
    }
}

#[test]
fn the_wire_types_depend_on_nothing_in_the_workspace() {
    let graph = graph();
    let workspace: Vec<&str> = graph.direct.keys().map(String::as_str).collect();
    assert_none("fairway-api", &graph.reachable["fairway-api"], &workspace);
}

#[test]
fn the_connection_to_postgresql_depends_on_nothing_in_the_workspace() {
    let graph = graph();
    let workspace: Vec<&str> = graph.direct.keys().map(String::as_str).collect();
    assert_none("fairway-pg", &graph.reachable["fairway-pg"], &workspace);
}

#[test]
fn the_broker_knows_neither_http_nor_the_command_line() {
    let graph = graph();
    let broker = &graph.reachable["fairway-broker"];
    assert_none("fairway-broker", broker, &["fairway-server", "fairway-client"]);
    assert_none("fairway-broker", broker, &["actix-web", "clap", "reqwest"]);
}

#[test]
fn the_client_needs_neither_actix_nor_a_postgresql_driver() {
    let graph = graph();
    let client = &graph.reachable["fairway-client"];
    assert_none("fairway-client", client, &["fairway-broker", "fairway-server"]);
    assert_none("fairway-client", client, &["actix-web", "tokio-postgres", "deadpool-postgres"]);
}

#[test]
fn the_wire_types_and_the_client_carry_no_trace_exporter() {
    let graph = graph();
    let exporter = ["opentelemetry", "opentelemetry_sdk", "opentelemetry-otlp"];
    for product in ["fairway-api", "fairway-client"] {
        assert_none(product, &graph.reachable[product], &exporter);
    }
}

/// The broker's duties: each a folder of `crates/fairway-broker/src` with its Rust and its
/// statements' `.sql` files; a duty that installs server functions or triggers has a folder of
/// the same name in the workspace's `sql/`.
const DUTIES: [&str; 9] = [
    "auth",
    "claims",
    "counters",
    "endings",
    "jobs",
    "maintenance",
    "policies",
    "tenancy",
    "traces",
];

fn broker_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/fairway-broker/src")
}

/// Every file under `dir` whose name ends in `extension`, at any depth.
fn files_under(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable folder") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            found.extend(files_under(&path, extension));
        } else if path.extension().is_some_and(|found| found == extension) {
            found.push(path);
        }
    }
    found
}

#[test]
fn each_duty_reads_no_other_duty_s_statements() {
    for duty in DUTIES {
        for file in files_under(&broker_source().join(duty), "rs") {
            let text = std::fs::read_to_string(&file).expect("readable source");
            for other in DUTIES.iter().filter(|other| **other != duty) {
                assert!(
                    !text.contains(&format!("crate::{other}::statements")),
                    "{} reads the statements of {other}: call a function of {other} instead",
                    file.display()
                );
            }
        }
    }
}

#[test]
fn every_broker_statement_sits_in_the_folder_of_the_duty_that_declares_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in files_under(&broker_source(), "sql") {
        let relative =
            file.strip_prefix(root).expect("under the root").to_string_lossy().into_owned();
        let folder = file.parent().expect("a folder");
        let name = file.file_stem().expect("a name").to_string_lossy().into_owned();
        let declared = files_under(folder, "rs").iter().any(|source| {
            let text = std::fs::read_to_string(source).expect("readable source");
            text.contains(&format!("= \"{name}\" ->"))
        });
        assert!(
            declared,
            "{relative} is not a statement its folder declares: a server function or trigger \
             belongs in sql/<duty>/"
        );
    }
}

/// The folders and files the design card names at the top of the workspace.
const TOP_LEVEL: [&str; 8] =
    ["Cargo.toml", "migrations", "src", "sql", "tests", "k8s", "Makefile", "README.md"];

#[test]
fn the_workspace_has_the_design_card_s_top_level() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in TOP_LEVEL {
        assert!(root.join(name).exists(), "the workspace has no {name}");
    }
}

/// Each folder of `sql/` is named like a duty of the broker, and holds only server functions,
/// each in the file named like it; the broker installs every one of them.
#[test]
fn every_folder_of_sql_is_a_duty_and_every_file_a_function_the_broker_installs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let installed: BTreeSet<String> =
        fairway_broker::db::functions::FILES.iter().map(|file| file.path()).collect();
    let mut on_disk = BTreeSet::new();
    for entry in std::fs::read_dir(root.join("sql")).expect("sql/ exists") {
        let folder = entry.expect("directory entry").path();
        let duty = folder.file_name().expect("a name").to_string_lossy().into_owned();
        assert!(
            DUTIES.contains(&duty.as_str()) && broker_source().join(&duty).is_dir(),
            "sql/{duty} is named like no duty of crates/fairway-broker/src"
        );
        for file in files_under(&folder, "sql") {
            let name = file.file_stem().expect("a name").to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&file).expect("readable file");
            assert!(
                text.contains(&format!("CREATE OR REPLACE FUNCTION {name}(")),
                "sql/{duty}/{name}.sql must define the function {name}"
            );
            on_disk.insert(format!("sql/{duty}/{name}.sql"));
        }
    }
    assert_eq!(on_disk, installed, "the broker installs exactly the files of sql/");
}

/// The calls between the duties' server functions run one way: a duty whose SQL calls another
/// duty's function is never called back by it, directly or through a third.
#[test]
fn the_server_functions_of_the_duties_call_each_other_one_way() {
    let files = fairway_broker::db::functions::FILES;
    let mut calls: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for caller in files {
        for callee in files.iter().filter(|callee| callee.duty != caller.duty) {
            if calls_function(caller.text, callee.name) {
                calls.entry(caller.duty).or_default().insert(callee.duty);
            }
        }
    }
    // Depth first from each duty: reaching the duty again is a cycle.
    for start in calls.keys() {
        let mut stack: Vec<Vec<&str>> = vec![vec![start]];
        while let Some(path) = stack.pop() {
            let last = path[path.len() - 1];
            for next in calls.get(last).into_iter().flatten() {
                assert!(next != start, "the duties' SQL calls in a circle: {path:?} -> {next}");
                if !path.contains(next) {
                    stack.push([path.clone(), vec![next]].concat());
                }
            }
        }
    }
}

/// Whether `text` calls the function `name`: its name, not part of a longer one, then `(`.
fn calls_function(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = &text[at + name.len()..];
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.starts_with('(')
    })
}

/// The fair order's sorts are spelled once, in the broker's build script: a function file or
/// statement that spelled one itself could drift from the others when the order changes.
/// Each level's sort is the only place `NULLS FIRST` appears, so no file may write it.
#[test]
fn the_fair_order_is_spelled_only_where_it_is_defined() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = files_under(&root.join("sql"), "sql").into_iter();
    for file in sources.chain(files_under(&broker_source(), "sql")) {
        let text = std::fs::read_to_string(&file).expect("readable file");
        assert!(
            !text.to_uppercase().contains("NULLS FIRST"),
            "{} spells out a sort of the fair order: write {{{{<level>_order <alias>}}}}",
            file.display()
        );
    }
    let installed = fairway_broker::db::functions::FILES;
    let expanded = installed.iter().filter(|file| file.text.contains("NULLS FIRST")).count();
    assert!(expanded >= 4, "the installed functions read the order ({expanded} files)");
    assert!(installed.iter().all(|file| !file.text.contains("{{")), "every order is written out");
}

/// The item counters have one writer, the counters duty: every statement and server function
/// that sets one lives in `counters/` or `sql/counters/`, and the others hand their changes on.
#[test]
fn only_the_counters_duty_writes_the_counters() {
    const COUNTERS: [&str; 8] = [
        "ready_count",
        "running_count",
        "scheduled_count",
        "successful_count",
        "failed_count",
        "canceled_count",
        "local_ready",
        "local_running",
    ];
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = files_under(&root.join("sql"), "sql").into_iter();
    for file in sources.chain(files_under(&broker_source(), "sql")) {
        if file.parent().is_some_and(|folder| folder.ends_with("counters")) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("readable file");
        let code: String = text
            .lines()
            .map(|line| line.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        for counter in COUNTERS {
            // A column set is named bare (`SET ready_count = ...`, or in a list); a column read
            // is mostly named with its table's alias.
            let set = code.match_indices(counter).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + counter.len()..].trim_start();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
                    && (after.starts_with('=') && !after.starts_with("=>")
                        || after.starts_with(',') && code[..at].trim_end().ends_with('('))
            });
            assert!(!set, "{} sets {counter}: only counters/ moves the counters", file.display());
        }
    }
}

/// A long function is split into named steps: none of `sql/` is over 200 lines.
#[test]
fn no_server_function_is_over_200_lines() {
    for file in fairway_broker::db::functions::FILES {
        let lines = file.text.lines().count();
        assert!(lines <= 200, "{} has {lines} lines: split it into named steps", file.path());
    }
}

/// The other way: no duty keeps database code of its own, and migrations hold schema only.
#[test]
fn server_functions_live_only_in_sql() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in files_under(&broker_source(), "sql") {
        let text = std::fs::read_to_string(&file).expect("readable statement");
        assert!(
            !text.to_uppercase().contains("CREATE OR REPLACE FUNCTION"),
            "{} defines a server function: it belongs in sql/<duty>/",
            file.display()
        );
    }
    for file in files_under(&root.join("migrations"), "sql") {
        let text = std::fs::read_to_string(&file).expect("readable migration");
        let upper = text.to_uppercase();
        assert!(
            !upper.contains("CREATE FUNCTION") && !upper.contains("CREATE OR REPLACE FUNCTION"),
            "{} defines a server function: migrations hold schema only",
            file.display()
        );
    }
}

/// A release's version is written in a few places, which `make version` sets together: the
/// workspace's (the binary's and the Rust client's, `CARGO_PKG_VERSION`), the published crates'
/// dependency lines, the Python package's and the image's label. They agree.
#[test]
fn the_version_is_the_same_everywhere_it_is_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let version = env!("CARGO_PKG_VERSION");
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect("a readable file");
    let cargo = read("Cargo.toml");
    for name in ["fairway-api", "fairway-client"] {
        let line = cargo
            .lines()
            .find(|line| line.starts_with(&format!("{name} = {{")))
            .unwrap_or_else(|| panic!("no dependency line for {name}"));
        assert!(line.contains(&format!("version = \"{version}\"")), "{line}");
    }
    let python = read("clients/python/pyproject.toml");
    assert!(python.lines().any(|line| line == format!("version = \"{version}\"")), "pyproject");
    let image = read("Dockerfile");
    let label = format!("LABEL org.opencontainers.image.version=\"{version}\"");
    assert!(image.lines().any(|line| line == label), "the image's label is not {version}");
    let production = read("k8s/overlays/production/kustomization.yaml");
    let tag = format!("    newTag: {version}");
    assert!(production.lines().any(|line| line == tag), "the production overlay's tag");
}
