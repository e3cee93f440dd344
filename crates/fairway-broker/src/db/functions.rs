//! The server functions in `sql/functions/`, one file each, installed as one set after the
//! migrations. The database records which set it holds (`fairway_functions`), so that a
//! broker carrying the same set does nothing and one carrying an older set refuses to start
//! rather than overwrite newer functions.

use sha2::{Digest, Sha256};
use tokio_postgres::Transaction;

use super::DbError;

/// Raise this whenever a file in `sql/functions/` changes, and pin the new digest in the
/// tests below: it is how brokers tell an older function set from a newer one. A unit test
/// fails until both match the files.
pub const REVISION: i32 = 18;

macro_rules! function_files {
    ($($name:literal),* $(,)?) => {
        &[$(
            FunctionFile {
                name: $name,
                text: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"), "/../../sql/functions/", $name, ".sql"
                )),
            },
        )*]
    };
}

/// One file of `sql/functions/`: a function named as the file, and for a trigger function the
/// trigger bindings that call it (a binding can only be made once its function exists).
#[derive(Debug)]
pub struct FunctionFile {
    pub name: &'static str,
    pub text: &'static str,
}

/// Every file of `sql/functions/`; a test checks that the folder holds no other.
pub const FILES: &[FunctionFile] = function_files![
    "apply_step_deltas",
    "apply_tenant_delta",
    "apply_tenant_deltas",
    "claim_fair_round",
    "claim_items",
    "finish_items",
    "fold_strategy_running",
    "fold_tenant_running_changes",
    "log_strategy_running",
    "lower_ready_from",
    "promote_scheduled_items",
    "recount_tenant_running",
    "tenant_has_rivals",
    "track_claimable_step",
];

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

/// Brings the database's functions to this broker's set, inside `transaction`, which the
/// caller commits. The caller holds the migration lock, so no other broker installs meanwhile.
pub async fn install(transaction: &Transaction<'_>) -> Result<(), DbError> {
    let digest = digest();
    let installed = transaction
        .query_opt("SELECT revision, digest FROM fairway_functions FOR UPDATE", &[])
        .await?;
    if let Some(row) = installed {
        let (revision, installed_digest): (i32, String) = (row.try_get(0)?, row.try_get(1)?);
        if revision > REVISION {
            return Err(DbError::NewerFunctions { installed: revision, carried: REVISION });
        }
        if revision == REVISION {
            if installed_digest == digest {
                return Ok(());
            }
            return Err(DbError::FunctionsDiffer { revision });
        }
    }
    drop_installed(transaction).await?;
    for file in FILES {
        transaction
            .batch_execute(file.text)
            .await
            .map_err(|source| DbError::FunctionFile { name: file.name, source })?;
    }
    let names: Vec<&str> = FILES.iter().map(|file| file.name).collect();
    transaction
        .execute(
            "INSERT INTO fairway_functions (revision, digest, signatures)
             SELECT $1, $2, array_agg(p.oid::regprocedure::text ORDER BY p.proname)
               FROM pg_proc p
              WHERE p.pronamespace = current_schema()::regnamespace
                AND p.proname = ANY($3)
             ON CONFLICT (singleton) DO UPDATE
                SET revision = EXCLUDED.revision,
                    digest = EXCLUDED.digest,
                    signatures = EXCLUDED.signatures,
                    installed_at = now()",
            &[&REVISION, &digest, &names],
        )
        .await?;
    tracing::info!(revision = REVISION, %digest, "installed the server functions");
    Ok(())
}

/// Drops the functions the previous set installed, so that one whose signature changed, or
/// that the new set no longer has, does not linger beside its replacement. CASCADE takes the
/// trigger bindings with them; their files make them again.
async fn drop_installed(transaction: &Transaction<'_>) -> Result<(), DbError> {
    let row = transaction.query_opt("SELECT signatures FROM fairway_functions", &[]).await?;
    let signatures: Vec<String> = match row {
        Some(row) => row.try_get(0)?,
        None => return Ok(()),
    };
    for signature in signatures {
        // A signature comes from regprocedure's own output, which quotes what needs quoting.
        transaction.batch_execute(&format!("DROP FUNCTION IF EXISTS {signature} CASCADE")).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest of the files at [`REVISION`].
    const PINNED_DIGEST: &str = "cafe05d68cf3408b3eae7b55ef9255831a5a9f8c572d48b2d6c78b437dd35274";

    #[test]
    fn the_digest_is_pinned_for_this_revision() {
        assert_eq!(
            digest(),
            PINNED_DIGEST,
            "sql/functions/ changed: raise REVISION and pin the new digest in src/db/functions.rs"
        );
    }

    #[test]
    fn every_file_in_the_folder_is_installed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sql/functions");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .expect("sql/functions exists")
            .map(|entry| entry.expect("directory entry").file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let listed: Vec<String> = FILES.iter().map(|file| format!("{}.sql", file.name)).collect();
        assert_eq!(on_disk, listed, "FILES must list every file of sql/functions/, in name order");
    }
}
