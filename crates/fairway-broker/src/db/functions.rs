//! The server functions, one file each in the workspace's `sql/`, in the folder of the duty they
//! serve (`sql/claims/claim_items.sql`), installed as one set after the migrations. The database
//! records which set it holds (`fairway_functions`), so that a broker carrying the same set does
//! nothing and one carrying an older set refuses to start rather than overwrite newer functions.

use sha2::{Digest, Sha256};
use tokio_postgres::Transaction;

use super::DbError;

/// Raise this whenever a function's file changes, and pin the new digest in the
/// tests below: it is how brokers tell an older function set from a newer one. A unit test
/// fails until both match the files.
pub const REVISION: i32 = 36;

/// One server function's file: a function named as the file, and for a trigger function the
/// trigger bindings that call it (a binding can only be made once its function exists).
#[derive(Debug)]
pub struct FunctionFile {
    /// The duty whose folder in `sql/` holds the file.
    pub duty: &'static str,
    pub name: &'static str,
    pub text: &'static str,
}

impl FunctionFile {
    /// The file's path in the workspace, for messages.
    pub fn path(&self) -> String {
        format!("sql/{}/{}.sql", self.duty, self.name)
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
