//! The server functions, one file each in the workspace's `sql/`, in the folder of the duty they
//! serve (`sql/claims/claim_items.sql`).
//!
//! Each build installs its set into a schema of its own, named by its revision and digest
//! ([`schema`]), and its connections find the set first on their `search_path`
//! (`pool::connect`). Brokers of two releases on one database therefore each call their own
//! functions, and neither replaces the other's: what lets a release roll forward and back
//! without a stop. `function_sets` records every set, and when a broker last used it; the
//! maintenance leader drops a set nobody has used for a while ([`prune`]).
//!
//! Trigger bindings belong to the tables, not to a set, so one set owns them: the newest, by
//! revision. Its trigger functions then see the writes of every broker, older ones included,
//! which is why a trigger function, like a migration, may only grow within a release.

use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_postgres::{GenericClient, Transaction};

use super::DbError;

/// Raise this whenever a function's file changes, and pin the new digest in the tests below:
/// it is how brokers tell which of two sets is the newer, the one that owns the triggers. A
/// unit test fails until both match the files. The upgrade drill's build is one revision on.
pub const REVISION: i32 = if cfg!(feature = "upgrade-drill") { 40 } else { 39 };

/// One server function's file: a function named as the file, and for a trigger function the
/// trigger bindings that call it (a binding can only be made once its function exists).
#[derive(Debug)]
pub struct FunctionFile {
    /// The duty whose folder in `sql/` holds the file.
    pub duty: &'static str,
    pub name: &'static str,
    pub text: &'static str,
}

/// Where a trigger function's file turns from the function to its bindings.
const BINDING: &str = "\nCREATE OR REPLACE TRIGGER ";

impl FunctionFile {
    /// The file's path in the workspace, for messages.
    pub fn path(&self) -> String {
        format!("sql/{}/{}.sql", self.duty, self.name)
    }

    /// The function's definition, without its trigger bindings.
    pub fn definition(&self) -> &'static str {
        self.text.find(BINDING).map_or(self.text, |at| &self.text[..at])
    }

    /// The trigger bindings that call the function, if it is a trigger function.
    pub fn bindings(&self) -> Option<&'static str> {
        self.text.find(BINDING).map(|at| &self.text[at..])
    }
}

/// Every file of the workspace's `sql/`, in file-name order, which is the order they install
/// in; the build script lists them from the tree.
pub const FILES: &[FunctionFile] = include!(concat!(env!("OUT_DIR"), "/function_files.rs"));

/// SHA-256 over every file's name and text, in name order, as hex.
pub fn digest() -> String {
    let mut hasher = Sha256::new();
    for file in FILES {
        hasher.update(file.name.as_bytes());
        hasher.update([0]);
        hasher.update(file.text.as_bytes());
        hasher.update([0]);
    }
    format!("{:x}", hasher.finalize())
}

/// The schema this build's set lives in: `fairway_r<revision>_<first 8 digits of the digest>`,
/// so that two builds whose files differ never share one, even at one revision.
pub fn schema() -> &'static str {
    static SCHEMA: OnceLock<String> = OnceLock::new();
    SCHEMA.get_or_init(|| format!("fairway_r{REVISION}_{}", &digest()[..8]))
}

/// The `search_path` of every connection of this build: its functions, then the tables.
pub fn search_path() -> String {
    format!("{},public", schema())
}

/// How long a change to the trigger bindings waits for the tables' locks before it gives up
/// and tries again, rather than queue every claim behind it.
const BINDING_LOCK_TIMEOUT: &str = "2s";

/// Makes sure the database holds this build's set, inside `transaction`, which the caller
/// commits, and marks it as in use. The caller holds the migration lock, so no other broker
/// installs or prunes meanwhile. A set of the same schema is this build's own, since the
/// schema names the digest; its row is checked all the same.
pub async fn install(transaction: &Transaction<'_>) -> Result<(), DbError> {
    let schema = schema();
    let digest = digest();
    let recorded = transaction
        .query_opt("SELECT digest FROM function_sets WHERE schema_name = $1 FOR UPDATE", &[&schema])
        .await?;
    match recorded {
        Some(row) => {
            if row.try_get::<_, String>(0)? != digest {
                return Err(DbError::FunctionsDiffer { schema: schema.to_owned() });
            }
            mark_in_use(transaction).await?;
        }
        None => {
            // A schema without its row is what a failed install or a hand-made copy leaves.
            transaction
                .batch_execute(&format!(
                    "DROP SCHEMA IF EXISTS {schema} CASCADE;
                     CREATE SCHEMA {schema};
                     SET LOCAL search_path = {};",
                    search_path()
                ))
                .await?;
            for file in FILES {
                transaction
                    .batch_execute(file.definition())
                    .await
                    .map_err(|source| DbError::FunctionFile { path: file.path(), source })?;
            }
            transaction
                .execute(
                    "INSERT INTO function_sets (schema_name, revision, digest, version)
                     VALUES ($1, $2, $3, $4)",
                    &[&schema, &REVISION, &digest, &env!("CARGO_PKG_VERSION")],
                )
                .await?;
            tracing::info!(revision = REVISION, schema, "installed the server functions");
        }
    }
    bind_triggers(transaction).await
}

/// Records that a broker of this build used its set just now. False when the set is gone:
/// it was pruned while this broker could not mark it, and must be installed again.
pub async fn mark_in_use<C: GenericClient>(client: &C) -> Result<bool, DbError> {
    let marked = client
        .execute(
            "UPDATE function_sets SET last_used_at = now(), version = $2 WHERE schema_name = $1",
            &[&schema(), &env!("CARGO_PKG_VERSION")],
        )
        .await?;
    Ok(marked == 1)
}

/// Gives every trigger binding to this build's set when it is the newest the database holds,
/// dropping the bindings of older sets first; leaves them alone when a newer set owns them, or
/// when this set already does.
async fn bind_triggers(transaction: &Transaction<'_>) -> Result<(), DbError> {
    let newest: String = transaction
        .query_one(
            "SELECT schema_name FROM function_sets ORDER BY revision DESC, installed_at DESC LIMIT 1",
            &[],
        )
        .await?
        .try_get(0)?;
    if newest != schema() {
        return Ok(());
    }
    let bindings: Vec<&str> = FILES.iter().filter_map(FunctionFile::bindings).collect();
    let trigger_functions: Vec<&str> =
        FILES.iter().filter(|file| file.bindings().is_some()).map(|file| file.name).collect();
    let wanted = bindings.iter().map(|text| text.matches(BINDING).count()).sum::<usize>();
    // Every binding a set made: one calling a function of a registered set, or one of the
    // trigger functions of the set that lived in public.
    let current = transaction
        .query(
            "SELECT n.nspname::text, format('DROP TRIGGER %I ON %s', t.tgname, t.tgrelid::regclass)
               FROM pg_trigger t
               JOIN pg_proc p ON p.oid = t.tgfoid
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE NOT t.tgisinternal
                AND (n.nspname IN (SELECT schema_name FROM function_sets)
                     OR (n.nspname = 'public' AND p.proname = ANY($1)))",
            &[&trigger_functions],
        )
        .await?;
    let owners: Vec<&str> = current.iter().map(|row| row.try_get(0)).collect::<Result<_, _>>()?;
    if owners.len() == wanted && owners.iter().all(|owner| *owner == schema()) {
        return Ok(());
    }
    transaction
        .batch_execute(&format!(
            "SET LOCAL lock_timeout = '{BINDING_LOCK_TIMEOUT}';
             SET LOCAL search_path = {};",
            search_path()
        ))
        .await?;
    for binding in &current {
        transaction.batch_execute(binding.try_get::<_, &str>(1)?).await?;
    }
    for text in bindings {
        transaction.batch_execute(text).await?;
    }
    tracing::info!(schema = schema(), "the trigger bindings call this build's functions");
    Ok(())
}

/// Drops the sets no broker has used for `retention`, inside `transaction`, which the caller
/// commits while holding the migration lock. A set newer than this build's owns the triggers,
/// so it goes only together with every newer set, and this build's set then takes the
/// bindings over; this build's own set never goes. Returns the schemas dropped.
pub async fn prune(
    transaction: &Transaction<'_>,
    retention: Duration,
) -> Result<Vec<String>, DbError> {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let sets = transaction
        .query(
            "SELECT schema_name, revision,
                    last_used_at < now() - make_interval(secs => $1::bigint / 1000.0)
               FROM function_sets
              ORDER BY revision, installed_at
                FOR UPDATE",
            &[&retention_ms],
        )
        .await?;
    let mine = schema();
    let Some(position) = sets.iter().position(|row| row.get::<_, &str>(0) == mine) else {
        return Ok(Vec::new());
    };
    let (older, newer) = (&sets[..position], &sets[position + 1..]);
    let newer_all_unused = newer.iter().all(|row| row.get::<_, bool>(2));
    let mut dropped = Vec::new();
    for row in older.iter().chain(if newer_all_unused { newer } else { &[] }) {
        if row.try_get::<_, bool>(2)? {
            dropped.push(row.try_get::<_, String>(0)?);
        }
    }
    if dropped.is_empty() {
        return Ok(dropped);
    }
    transaction
        .batch_execute(&format!("SET LOCAL lock_timeout = '{BINDING_LOCK_TIMEOUT}'"))
        .await?;
    for schema in &dropped {
        transaction.execute("DELETE FROM function_sets WHERE schema_name = $1", &[schema]).await?;
        // CASCADE takes any trigger binding that called the set; bind_triggers makes it again.
        transaction.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await?;
        tracing::info!(schema, "dropped a set of server functions no broker has used");
    }
    bind_triggers(transaction).await?;
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest of the files at [`REVISION`].
    #[cfg(not(feature = "upgrade-drill"))]
    const PINNED_DIGEST: &str = "fc2e4260356f7e5365aa897cb73410e561c57c11e1cc21f303ab436065335000";

    #[cfg(not(feature = "upgrade-drill"))]
    #[test]
    fn the_digest_is_pinned_for_this_revision() {
        assert_eq!(
            digest(),
            PINNED_DIGEST,
            "a function's file changed: raise REVISION and pin the new digest in src/db/functions.rs"
        );
    }

    #[test]
    fn a_trigger_functions_file_splits_into_the_function_and_its_bindings() {
        let file = FILES.iter().find(|file| file.name == "lower_ready_from").expect("listed");
        let bindings = file.bindings().expect("a trigger function");
        assert!(bindings
            .trim_start()
            .starts_with("CREATE OR REPLACE TRIGGER work_items_ready_again"));
        assert!(!file.definition().contains("CREATE OR REPLACE TRIGGER"));
        assert_eq!(file.definition().len() + bindings.len(), file.text.len());
        let plain = FILES.iter().find(|file| file.name == "finish_jobs").expect("listed");
        assert_eq!((plain.definition(), plain.bindings()), (plain.text, None));
    }

    #[test]
    fn the_schema_names_the_revision_and_the_digest() {
        assert_eq!(schema(), format!("fairway_r{REVISION}_{}", &digest()[..8]));
        assert!(schema()
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
    }

    #[cfg(not(feature = "upgrade-drill"))]
    #[test]
    fn every_file_of_sql_is_installed_once_in_name_order() {
        let sql = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sql");
        let mut on_disk = Vec::new();
        for duty in std::fs::read_dir(&sql).expect("sql/ exists") {
            let duty = duty.expect("directory entry").path();
            for file in std::fs::read_dir(&duty).expect("a duty's folder") {
                let path = file.expect("directory entry").path();
                let relative = path.strip_prefix(&sql).expect("under sql/");
                on_disk.push(format!("sql/{}", relative.to_string_lossy()));
            }
        }
        on_disk.sort_by_key(|path| path.rsplit('/').next().map(str::to_owned));
        let listed: Vec<String> = FILES.iter().map(FunctionFile::path).collect();
        assert_eq!(on_disk, listed, "FILES must list every file of sql/, in name order");
    }
}
