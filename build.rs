//! Tells the API tests which external tools this machine lacks, so that a test which cannot run
//! is reported as ignored instead of passing without having run. Under `FAIRWAY_REQUIRE_TOOLS`
//! (as `make test` sets it) nothing is ignored, and a missing tool fails the tests that need it.

use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    println!("cargo::rerun-if-changed=build.rs");
    for variable in ["FAIRWAY_REQUIRE_TOOLS", "FAIRWAY_TEST_PYTHON", "FAIRWAY_TEST_KUBECTL"] {
        println!("cargo::rerun-if-env-changed={variable}");
    }
    let tool = |variable: &str, default: &str| {
        std::env::var_os(variable).map(PathBuf::from).unwrap_or_else(|| root.join(default))
    };
    let python = tool("FAIRWAY_TEST_PYTHON", "target/pytools/bin/python");
    let kubectl = tool("FAIRWAY_TEST_KUBECTL", "target/kubernetes-client/usr/bin/kubectl");
    let pytools = python.parent().map(Path::to_path_buf).unwrap_or_default();
    let needs: [(&str, Vec<PathBuf>); 3] = [
        ("fairway_no_browser", vec!["/usr/bin/chromium".into(), "/usr/bin/chromedriver".into()]),
        (
            "fairway_no_pytools",
            vec![python.clone(), pytools.join("openapi-spec-validator"), pytools.join("st")],
        ),
        ("fairway_no_kubectl", vec![python, kubectl]),
    ];
    let require = std::env::var_os("FAIRWAY_REQUIRE_TOOLS").is_some();
    for (cfg, paths) in needs {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        for path in &paths {
            watch(&root, path);
        }
        if !require && paths.iter().any(|path| !path.exists()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

/// Reruns this script when the tool appears or goes: its folder is watched while the tool is
/// missing, since cargo reruns a script on every build for a watched path that does not exist.
/// A tool whose folder is missing too (no `target/pytools` yet) is looked for again when
/// `FAIRWAY_REQUIRE_TOOLS` changes, as it does between `make test` and a bare `cargo test`.
fn watch(root: &Path, path: &Path) {
    let watched = if path.exists() { Some(path) } else { path.parent().filter(|dir| dir.exists()) };
    if let Some(watched) =
        watched.filter(|watched| *watched != root && !watched.ends_with("target"))
    {
        println!("cargo::rerun-if-changed={}", watched.display());
    }
}
