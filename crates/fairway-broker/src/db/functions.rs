//! The server functions, one file each in the `functions/` folder of the duty they serve
//! (`claims/functions/claim_items.sql`), installed as one set after the migrations. The database
//! records which set it holds (`fairway_functions`), so that a broker carrying the same set does
//! nothing and one carrying an older set refuses to start rather than overwrite newer functions.

use sha2::{Digest, Sha256};
use tokio_postgres::Transaction;

use super::DbError;

/// Raise this whenever a function's file changes, and pin the new digest in the
/// tests below: it is how brokers tell an older function set from a newer one. A unit test
/// fails until both match the files.
pub const REVISION: i32 = 36;

macro_rules! function_files {
    ($($duty:literal / $name:literal),* $(,)?) => {
        &[$(
            FunctionFile {
                duty: $duty,
                name: $name,
                text: include_str!(concat!("../", $duty, "/functions/", $name, ".sql")),
            },
        )*]
    };
}

/// One server function's file: a function named as the file, and for a trigger function the
/// trigger bindings that call it (a binding can only be made once its function exists).
#[derive(Debug)]
pub struct FunctionFile {
    /// The folder of the duty whose `functions/` holds the file.
    pub duty: &'static str,
    pub name: &'static str,
    pub text: &'static str,
}

impl FunctionFile {
    /// The file's path in the broker's source, for messages.
    pub fn path(&self) -> String {
        format!("crates/fairway-broker/src/{}/functions/{}.sql", self.duty, self.name)
    }
}

/// Every function file, in name order, which is the order they install in; a test checks that
/// the duties' `functions/` folders hold no other.
pub const FILES: &[FunctionFile] = function_files![
    "claims" / "admit_services",
    "claims" / "admit_tenant",
    "counters" / "apply_step_deltas",
    "counters" / "apply_tenant_delta",
    "counters" / "apply_tenant_deltas",
    "claims" / "begin_claim_batch",
    "policies" / "bucket_charged",
    "policies" / "bucket_due",
    "policies" / "bucket_tokens",
    "claims" / "charge_services",
    "claims" / "claim_actor_path",
    "claims" / "claim_fair_round",
    "claims" / "claim_fair_user",
    "claims" / "claim_items",
    "claims" / "claim_step_item",
    "claims" / "claim_strategy_step",
    "claims" / "claim_tenant_row",
    "endings" / "finish_items",
    "endings" / "finish_jobs",
    "counters" / "fold_strategy_running",
    "counters" / "fold_tenant_running_changes",
    "claims" / "list_components",
    "counters" / "log_strategy_running",
    "counters" / "lower_ready_from",
    "claims" / "open_strategy_steps",
    "maintenance" / "promote_scheduled_items",
    "counters" / "recount_tenant_running",
    "policies" / "retry_ms_until",
    "claims" / "service_running",
    "claims" / "tenant_has_rivals",
    "claims" / "tenant_running",
    "counters" / "track_claimable_step",
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
            .map_err(|source| DbError::FunctionFile { path: file.path(), source })?;
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
    const PINNED_DIGEST: &str = "848a8ebfa7bf686673470ad8931e42bd4da6b857adc7196eb815410540890b2b";

    #[test]
    fn the_digest_is_pinned_for_this_revision() {
        assert_eq!(
            digest(),
            PINNED_DIGEST,
            "a function's file changed: raise REVISION and pin the new digest in src/db/functions.rs"
        );
    }

    #[test]
    fn every_function_file_is_installed_in_name_order() {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut on_disk = Vec::new();
        for duty in std::fs::read_dir(&source).expect("src exists") {
            let functions = duty.expect("directory entry").path().join("functions");
            let Ok(files) = std::fs::read_dir(&functions) else { continue };
            for file in files {
                let path = file.expect("directory entry").path();
                let relative = path.strip_prefix(&source).expect("under src");
                on_disk.push(relative.to_string_lossy().into_owned());
            }
        }
        on_disk.sort_by_key(|path| path.rsplit('/').next().map(str::to_owned));
        let listed: Vec<String> =
            FILES.iter().map(|file| format!("{}/functions/{}.sql", file.duty, file.name)).collect();
        assert_eq!(on_disk, listed, "FILES must list every duty's function file, in name order");
    }
}
