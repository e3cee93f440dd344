//! Lists the server functions to install from the tree: every file of the workspace's `sql/`,
//! one folder per duty, so that a new function file cannot be left out of the set. The list
//! is in file-name order, the order the set installs in.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

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

    let mut list = String::from("&[\n");
    for (name, duty, path) in &files {
        let path = path.canonicalize().expect("a listed file exists");
        writeln!(
            list,
            "    FunctionFile {{ duty: {duty:?}, name: {name:?}, text: include_str!({:?}) }},",
            path.display()
        )
        .expect("writing to a String");
    }
    list.push(']');
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it"));
    std::fs::write(out.join("function_files.rs"), list).expect("OUT_DIR is writable");
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
