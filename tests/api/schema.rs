//! The schema as the broker installs it: migrations hold the tables, the workspace's `sql/` holds
//! every server function, and the database can differ from neither.

use fairway_broker::db::functions::{self, FILES, REVISION};
use fairway_broker::db::{migrations, pool, DbError};
use fairway_pg::Database;

use crate::helpers::{connect, empty_database, fresh_database, spawn_app};

/// Installs the schema on the database `config` names, as a starting broker does.
async fn install(database: &Database) -> Result<(), DbError> {
    let pool = pool::connect(database, 1).expect("pool");
    let outcome = migrations::run(&pool).await;
    pool.close();
    outcome
}

/// The functions in the broker's schema that no extension owns, by name.
const OWN_FUNCTIONS: &str = "
    SELECT p.proname::text, count(*)
      FROM pg_proc p
     WHERE p.pronamespace = 'public'::regnamespace
       AND NOT EXISTS (SELECT 1 FROM pg_depend d
                        WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                          AND d.deptype = 'e')
     GROUP BY p.proname
     ORDER BY p.proname";

#[tokio::test]
async fn every_function_in_the_schema_is_its_file() {
    let app = spawn_app().await;
    let mut db = connect(&app.config).await;

    let rows = db.query(OWN_FUNCTIONS, &[]).await.expect("list functions");
    let installed: Vec<(String, i64)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let files: Vec<(String, i64)> = FILES.iter().map(|file| (file.name.to_owned(), 1)).collect();
    assert_eq!(installed, files, "one function per function file, and no other");

    // Each file run again in a scratch schema, then compared with what the broker installed,
    // definition by definition; rolled back, so that the database is left as it was.
    let transaction = db.transaction().await.expect("begin");
    transaction
        .batch_execute("CREATE SCHEMA drift_check; SET LOCAL search_path = drift_check, public")
        .await
        .expect("scratch schema");
    let trigger_definitions = "
        SELECT tgname::text, pg_get_triggerdef(t.oid)
          FROM pg_trigger t
         WHERE NOT t.tgisinternal AND t.tgrelid = 'public.work_items'::regclass
         ORDER BY tgname";
    let installed_triggers = transaction.query(trigger_definitions, &[]).await.expect("triggers");
    for file in FILES {
        transaction.batch_execute(file.text).await.expect("run the file");
        let row = transaction
            .query_one(
                "SELECT pg_get_functiondef(format('public.%I', $1::text)::regproc),
                        pg_get_functiondef(format('drift_check.%I', $1::text)::regproc)",
                &[&file.name],
            )
            .await
            .expect("both definitions");
        let (installed, from_file): (String, String) = (row.get(0), row.get(1));
        assert_eq!(
            installed,
            from_file.replace("drift_check.", "public."),
            "the database's {} differs from {}",
            file.name,
            file.path()
        );
    }
    let rebound_triggers = transaction.query(trigger_definitions, &[]).await.expect("triggers");
    let normalise = |rows: &[tokio_postgres::Row]| -> Vec<(String, String)> {
        rows.iter()
            .map(|row| {
                let definition: String = row.get(1);
                (row.get(0), definition.replace("drift_check.", ""))
            })
            .collect()
    };
    assert!(!installed_triggers.is_empty(), "the trigger bindings are installed");
    assert_eq!(normalise(&installed_triggers), normalise(&rebound_triggers));
    transaction.rollback().await.expect("rollback");

    let row = db
        .query_one("SELECT revision, digest FROM fairway_functions", &[])
        .await
        .expect("the installed set is recorded");
    assert_eq!(row.get::<_, i32>(0), REVISION);
    assert_eq!(row.get::<_, String>(1), functions::digest());
}

#[tokio::test]
async fn a_database_of_the_unfolded_migration_chain_is_refused_unchanged() {
    let config = empty_database().await;
    let db = connect(&config).await;
    // What the unfolded chain leaves behind: refinery's default history, and the tables.
    db.batch_execute(
        "CREATE TABLE refinery_schema_history (
             version integer PRIMARY KEY, name varchar(255), applied_on varchar(255),
             checksum varchar(255));
         INSERT INTO refinery_schema_history (version, name)
         VALUES (1, 'broker_core'), (9, 'endings_find_owners_by_key_and_report_deferrals'),
                (10, 'endings_plan_once');
         CREATE TABLE work_items (id bigint PRIMARY KEY, payload jsonb);
         INSERT INTO work_items VALUES (1, '{\"granule\": \"G1\"}');",
    )
    .await
    .expect("an old database");

    let error = install(&config).await.expect_err("the broker refuses it");
    assert!(matches!(error, DbError::UnfoldedSchema { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("last applied: V10__endings_plan_once"), "{message}");
    assert!(message.contains("Nothing was changed"), "{message}");
    assert!(message.contains("new, empty database"), "{message}");

    let row = db
        .query_one(
            "SELECT to_regclass('fairway_schema_history') IS NULL,
                    to_regclass('fairway_functions') IS NULL,
                    (SELECT count(*) FROM work_items),
                    (SELECT count(*) FROM refinery_schema_history)",
            &[],
        )
        .await
        .expect("look");
    assert!(row.get::<_, bool>(0), "no migration history was started");
    assert!(row.get::<_, bool>(1), "no function was installed");
    assert_eq!(row.get::<_, i64>(2), 1, "the old items are untouched");
    assert_eq!(row.get::<_, i64>(3), 3, "the old history is untouched");
}

#[tokio::test]
async fn tables_that_fairway_did_not_make_are_refused() {
    let config = empty_database().await;
    let db = connect(&config).await;
    db.batch_execute("CREATE TABLE work_items (id bigint PRIMARY KEY)").await.expect("table");
    let error = install(&config).await.expect_err("the broker refuses it");
    assert!(matches!(error, DbError::ForeignSchema), "{error:?}");
}

#[tokio::test]
async fn an_empty_database_gets_the_whole_schema_and_a_second_start_changes_nothing() {
    let config = empty_database().await;
    install(&config).await.expect("first start");
    let db = connect(&config).await;
    let before = function_oids_and_install_time(&db).await;
    install(&config).await.expect("second start");
    assert_eq!(function_oids_and_install_time(&db).await, before, "a matching set is left alone");
}

#[tokio::test]
async fn newer_functions_are_never_replaced_by_an_older_broker() {
    let config = fresh_database().await;
    let db = connect(&config).await;
    db.execute("UPDATE fairway_functions SET revision = revision + 1", &[]).await.expect("newer");
    let before = function_oids_and_install_time(&db).await;

    let error = install(&config).await.expect_err("an older broker refuses to start");
    assert!(
        matches!(error, DbError::NewerFunctions { installed, carried }
            if installed == REVISION + 1 && carried == REVISION),
        "{error:?}"
    );
    assert!(error.to_string().contains("never replaces newer functions"), "{error}");
    assert_eq!(function_oids_and_install_time(&db).await, before, "nothing was replaced");
}

#[tokio::test]
async fn the_same_revision_with_other_text_is_refused() {
    let config = fresh_database().await;
    let db = connect(&config).await;
    db.execute("UPDATE fairway_functions SET digest = 'another build'", &[]).await.expect("set");
    let before = function_oids_and_install_time(&db).await;

    let error = install(&config).await.expect_err("refused");
    assert!(matches!(error, DbError::FunctionsDiffer { revision } if revision == REVISION));
    assert_eq!(function_oids_and_install_time(&db).await, before, "nothing was replaced");
}

#[tokio::test]
async fn an_older_set_is_replaced_by_the_files_dropping_what_they_no_longer_hold() {
    let config = fresh_database().await;
    let db = connect(&config).await;
    // An older set: a function the files no longer have, one whose signature has since
    // changed, and a trigger function whose binding must survive its replacement.
    db.batch_execute(
        "CREATE FUNCTION retired_function() RETURNS integer LANGUAGE sql AS 'SELECT 1';
         CREATE FUNCTION tenant_has_rivals(text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
         UPDATE fairway_functions
            SET revision = 0,
                digest = 'older',
                signatures = signatures || '{retired_function(),tenant_has_rivals(text)}';",
    )
    .await
    .expect("an older set");

    install(&config).await.expect("a newer broker installs its set");

    let rows = db.query(OWN_FUNCTIONS, &[]).await.expect("list functions");
    let installed: Vec<(String, i64)> = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let files: Vec<(String, i64)> = FILES.iter().map(|file| (file.name.to_owned(), 1)).collect();
    assert_eq!(installed, files, "the retired function and the old overload are gone");
    let row = db
        .query_one(
            "SELECT revision, digest,
                    (SELECT count(*) FROM pg_trigger WHERE tgname = 'work_items_ready_again')
               FROM fairway_functions",
            &[],
        )
        .await
        .expect("look");
    assert_eq!(row.get::<_, i32>(0), REVISION);
    assert_eq!(row.get::<_, String>(1), functions::digest());
    assert_eq!(row.get::<_, i64>(2), 1, "the trigger binding was made again");
}

async fn function_oids_and_install_time(db: &tokio_postgres::Client) -> (Vec<u32>, String) {
    let oids = db
        .query(
            "SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
              ORDER BY p.oid",
            &[],
        )
        .await
        .expect("oids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let installed_at = db
        .query_one("SELECT installed_at::text FROM fairway_functions", &[])
        .await
        .expect("installed_at")
        .get(0);
    (oids, installed_at)
}

/// Which build a broker is, and what its database holds: the same three things in
/// `GET /admin/version` and in `fairway --version`.
#[tokio::test]
async fn a_broker_says_its_version_revision_and_migration_and_the_databases() {
    let app = spawn_app().await;
    let answer: serde_json::Value = app.get("/admin/version").await.json().await.expect("JSON");
    let latest = migrations::latest();
    assert!(latest.starts_with('V') && latest.contains("__"), "{latest}");
    let expected = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "functions_revision": REVISION,
        "schema_migration": latest,
        "database": { "functions_revision": REVISION, "schema_migration": latest },
    });
    assert_eq!(answer, expected);

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
        .arg("--version")
        .output()
        .await
        .expect("run fairway --version");
    assert!(output.status.success());
    let printed = String::from_utf8_lossy(&output.stdout);
    let line = format!(
        "fairway {} (server functions revision {REVISION}, schema {latest})",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(printed.trim(), line);
}

/// The last migration of release 0.1.0, made before the rule that a release's migrations only
/// expand the schema: every later one is held to it.
const LAST_MIGRATION_BEFORE_THE_RULE: u32 = 19;

/// What a migration contracts, in words, or None when it only adds: a statement that an older
/// broker still running beside it could trip over (a table, a column or a name it reads gone,
/// a type it writes changed, a column it leaves out made mandatory).
fn contraction(sql: &str) -> Option<&'static str> {
    let text: String = sql
        .lines()
        .map(|line| line.split("--").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ")
        .to_uppercase()
        .replace(';', " ; ")
        .replace(',', " , ");
    let words: Vec<&str> = text.split_whitespace().collect();
    let has = |phrase: &[&str]| words.windows(phrase.len()).any(|window| window == phrase);
    let statements: Vec<&str> = text.split(';').collect();
    let adds_a_mandatory_column = statements.iter().any(|statement| {
        let statement: Vec<&str> = statement.split_whitespace().collect();
        let adds = statement.windows(2).any(|w| w == ["ADD", "COLUMN"]);
        let mandatory = statement.windows(2).any(|w| w == ["NOT", "NULL"]);
        adds && mandatory && !statement.contains(&"DEFAULT")
    });
    if has(&["DROP", "TABLE"]) {
        Some("drops a table")
    } else if has(&["DROP", "COLUMN"]) {
        Some("drops a column")
    } else if has(&["RENAME"]) {
        Some("renames")
    } else if has(&["SET", "NOT", "NULL"]) {
        Some("makes a column mandatory")
    } else if has(&["SET", "DATA", "TYPE"])
        || words.windows(4).any(|w| w[0] == "ALTER" && w[1] == "COLUMN" && w[3] == "TYPE")
    {
        Some("changes a column's type")
    } else if adds_a_mandatory_column {
        Some("adds a mandatory column without a default")
    } else {
        None
    }
}

#[test]
fn contractions_are_told_apart_from_additions() {
    let additions = [
        "ALTER TABLE users ADD COLUMN tier smallint NOT NULL DEFAULT 3;",
        "CREATE TABLE order_clocks (service text PRIMARY KEY); -- not DROP TABLE, a comment",
        "CREATE INDEX users_tier ON users (tier); ALTER TABLE users ADD COLUMN pass bigint;",
        "CREATE TYPE tier AS ENUM ('a', 'b'); ALTER TABLE users ALTER COLUMN weight SET DEFAULT 2;",
    ];
    for sql in additions {
        assert_eq!(contraction(sql), None, "{sql}");
    }
    let contractions = [
        ("DROP TABLE pruned_work;", "drops a table"),
        ("ALTER TABLE users DROP COLUMN weight;", "drops a column"),
        ("ALTER TABLE users RENAME COLUMN weight TO share_weight;", "renames"),
        ("ALTER TABLE users ALTER COLUMN weight SET NOT NULL;", "makes a column mandatory"),
        ("ALTER TABLE users ALTER COLUMN weight TYPE bigint;", "changes a column's type"),
        ("ALTER TABLE users ALTER COLUMN weight SET DATA TYPE bigint;", "changes a column's type"),
        (
            "ALTER TABLE users ADD COLUMN tier smallint NOT NULL;",
            "adds a mandatory column without a default",
        ),
    ];
    for (sql, what) in contractions {
        assert_eq!(contraction(sql), Some(what), "{sql}");
    }
}

/// Within a release the migrations only expand the schema, so that brokers of the release
/// before keep working beside them during a rolling upgrade (docs/schema.md).
#[test]
fn migrations_after_the_first_release_only_expand_the_schema() {
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&folder).expect("migrations/") {
        let path = entry.expect("directory entry").path();
        let name = path.file_name().expect("a name").to_string_lossy().into_owned();
        let version: u32 = name
            .strip_prefix('V')
            .and_then(|rest| rest.split("__").next())
            .and_then(|number| number.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not named V<n>__<what>.sql"));
        let sql = std::fs::read_to_string(&path).expect("a readable migration");
        checked.push(version);
        if version > LAST_MIGRATION_BEFORE_THE_RULE {
            if let Some(what) = contraction(&sql) {
                panic!("{name} {what}: a release's migrations only expand the schema");
            }
        }
    }
    assert!(checked.contains(&LAST_MIGRATION_BEFORE_THE_RULE), "{checked:?}");
}
