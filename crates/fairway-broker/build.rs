//! Lists the server functions to install from the tree: every file of the workspace's `sql/`,
//! one folder per duty, so that a new function file cannot be left out of the set. The list
//! is in file-name order, the order the set installs in.
//!
//! With the test-only `upgrade-drill` feature, one function differs (see [`DRILL_CHANGE`]):
//! the upgrade test rolls to that build and back.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The upgrade drill's change to a server function (tests/upgrade): `finish_jobs` also marks
/// each job it finished in the column the drill's migration adds. The text it replaces must be
/// found, once, or the build fails.
const DRILL_CHANGE: (&str, &str, &str) =
    ("finish_jobs", "updated_at = now()", "updated_at = now(), finished_by_drill = true");

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let sql = manifest.join("../../sql");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed={}", sql.display());

    let mut files = Vec::new();
    for duty in entries(&sql) {
        if !duty.is_dir() {
            panic!("{}: sql/ holds only one folder per duty", duty.display());
        }
        for file in entries(&duty) {
            if file.extension().is_none_or(|extension| extension != "sql") {
                panic!("{}: a duty's folder in sql/ holds only .sql files", file.display());
            }
            files.push((stem(&file), stem(&duty), file));
        }
    }
    files.sort();
    if let Some(pair) = files.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        panic!(
            "two server functions are named {}: in sql/{} and sql/{}",
            pair[0].0, pair[0].1, pair[1].1
        );
    }

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    let mut list = String::from("&[\n");
    for (name, duty, path) in &files {
        let mut path = path.canonicalize().expect("a listed file exists");
        if std::env::var_os("CARGO_FEATURE_UPGRADE_DRILL").is_some() && name == DRILL_CHANGE.0 {
            path = drill_copy(&path, &out);
        }
        writeln!(
            list,
            "    FunctionFile {{ duty: {duty:?}, name: {name:?}, text: include_str!({:?}) }},",
            path.display()
        )
        .expect("writing to a String");
    }
    list.push(']');
    std::fs::write(out.join("function_files.rs"), list).expect("OUT_DIR is writable");
}

/// Writes the drill's version of the function file at `path` into `out`, and returns its path.
fn drill_copy(path: &Path, out: &Path) -> PathBuf {
    let (_, find, replace) = DRILL_CHANGE;
    let text = std::fs::read_to_string(path).expect("a listed file is readable");
    assert_eq!(text.matches(find).count(), 1, "{}: the drill changes `{find}`", path.display());
    let copy = out.join(path.file_name().expect("a file name"));
    std::fs::write(&copy, text.replace(find, replace)).expect("OUT_DIR is writable");
    copy
}

/// A folder's entries, sorted; a missing `sql/` is a broken checkout.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
        .map(|entry| entry.expect("a readable folder entry").path())
        .collect();
    found.sort();
    found
}

fn stem(path: &Path) -> String {
    path.file_stem().expect("a file name").to_string_lossy().into_owned()
}
