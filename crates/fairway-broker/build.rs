//! Lists the server functions to install from the tree: every file of the workspace's `sql/`,
//! one folder per duty, so that a new function file cannot be left out of the set. The list
//! is in file-name order, the order the set installs in.
//!
//! The fair order's sort at each level is defined once, in [`FAIR_ORDER`], and written into
//! each file that reads it where the file says `{{<level>_order <alias>}}`.
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

/// The fair order, one sort per level: the claim's picks, its sets, the strategies' fallback
/// and the check for claimable work all read a level through these, so that they cannot
/// disagree. Each is the tail of that level's index (migrations), which the reads walk.
/// A column is written `{t}.column`; `{t}` becomes the alias the file gives.
const FAIR_ORDER: &[(&str, &str)] = &[
    // Tenants within a (service, component): the operator's tier first, then least work in
    // progress for their weight, then the earliest weighted turn (turn_start: a row never
    // served first), then least recently worked.
    (
        "tenant_order",
        "{t}.tier, {t}.share, {t}.pass NULLS FIRST, {t}.last_worked NULLS FIRST, {t}.tenant",
    ),
    // Users within a tenant's queue, likewise.
    (
        "user_order",
        "{t}.tier, {t}.share, {t}.pass NULLS FIRST, {t}.last_worked NULLS FIRST, {t}.username",
    ),
    // Actors within a user's queue, by their own counts.
    ("actor_order", "{t}.running_count, {t}.last_worked NULLS FIRST, {t}.path"),
    // A user's (or actor's) job steps: synchronous first, then the job's priority, then least
    // recently worked; the job and step make it total.
    (
        "step_order",
        "{t}.is_async, {t}.priority DESC, {t}.order_worked NULLS FIRST, {t}.job_id, \
         {t}.step_index",
    ),
];

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
    let drill = std::env::var_os("CARGO_FEATURE_UPGRADE_DRILL").is_some();
    for (name, duty, path) in &files {
        let source = std::fs::read_to_string(path)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
        let mut text = with_fair_order(&source, path);
        if drill && name == DRILL_CHANGE.0 {
            text = drill_change(&text, path);
        }
        let path = out.join(format!("{name}.sql"));
        std::fs::write(&path, text).expect("OUT_DIR is writable");
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

/// `text` with each `{{<level>_order <alias>}}` written out from [`FAIR_ORDER`]; any other
/// `{{` fails the build.
fn with_fair_order(text: &str, path: &Path) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find("}}")
            .unwrap_or_else(|| panic!("{}: an unclosed {{{{", path.display()));
        let placeholder = &rest[start + 2..start + end];
        let (level, alias) = placeholder
            .split_once(' ')
            .unwrap_or_else(|| panic!("{}: {{{{{placeholder}}}}} names no alias", path.display()));
        let (_, sort) = FAIR_ORDER
            .iter()
            .find(|(name, _)| *name == level)
            .unwrap_or_else(|| panic!("{}: no fair order is named {level}", path.display()));
        out.push_str(&sort.replace("{t}", alias.trim()));
        rest = &rest[start + end + 2..];
    }
    out.push_str(rest);
    out
}

/// The drill's version of the function file `text`, read from `path`.
fn drill_change(text: &str, path: &Path) -> String {
    let (_, find, replace) = DRILL_CHANGE;
    assert_eq!(text.matches(find).count(), 1, "{}: the drill changes `{find}`", path.display());
    text.replace(find, replace)
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
