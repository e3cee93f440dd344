//! The schema as the broker installs it: migrations hold the tables, the workspace's `sql/` holds
//! every server function, installed into a schema of the build's own, and the database can
//! differ from neither. Builds side by side: an older broker starts beside newer functions and
//! migrations, the newest set owns the trigger bindings, and unused sets are dropped.

use std::time::Duration;

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

/// The functions in `schema` that no extension owns, by name.
async fn functions_in(db: &tokio_postgres::Client, schema: &str) -> Vec<(String, i64)> {
    db.query(
        "SELECT p.proname::text, count(*)
           FROM pg_proc p
          WHERE p.pronamespace = $1::text::regnamespace
            AND NOT EXISTS (SELECT 1 FROM pg_depend d
                             WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                               AND d.deptype = 'e')
          GROUP BY p.proname
          ORDER BY p.proname",
        &[&schema],
    )
    .await
    .expect("list functions")
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect()
}

/// One function per file of `sql/`, by name.
fn every_file() -> Vec<(String, i64)> {
    FILES.iter().map(|file| (file.name.to_owned(), 1)).collect()
}

/// The schema of the function each trigger binding calls, by the binding's name.
async fn trigger_owners(db: &tokio_postgres::Client) -> Vec<(String, String)> {
    db.query(
        "SELECT t.tgname::text, n.nspname::text
           FROM pg_trigger t
           JOIN pg_proc p ON p.oid = t.tgfoid
           JOIN pg_namespace n ON n.oid = p.pronamespace
          WHERE NOT t.tgisinternal
          ORDER BY 1",
        &[],
    )
    .await
    .expect("list triggers")
    .iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect()
}

/// The trigger bindings the files make, each calling `schema`.
fn bindings_owned_by(schema: &str) -> Vec<(String, String)> {
    let mut bindings: Vec<(String, String)> = FILES
        .iter()
        .filter_map(|file| file.bindings())
        .flat_map(|text| text.split("CREATE OR REPLACE TRIGGER ").skip(1))
        .map(|rest| {
            (rest.split_whitespace().next().unwrap_or_default().to_owned(), schema.to_owned())
        })
        .collect();
    bindings.sort();
    bindings
}

#[tokio::test]
async fn every_function_in_the_builds_schema_is_its_file() {
    let app = spawn_app().await;
    let mut db = connect(&app.config).await;
    let schema = functions::schema();

    assert_eq!(functions_in(&db, schema).await, every_file(), "one function per file, no other");
    assert_eq!(functions_in(&db, "public").await, vec![], "nothing in public");
    assert_eq!(trigger_owners(&db).await, bindings_owned_by(schema));

    // Each file run again in a scratch schema, then compared with what the broker installed,
    // definition by definition; rolled back, so that the database is left as it was.
    let transaction = db.transaction().await.expect("begin");
    transaction
        .batch_execute("CREATE SCHEMA drift_check; SET LOCAL search_path = drift_check, public")
        .await
        .expect("scratch schema");
    for file in FILES {
        transaction.batch_execute(file.text).await.expect("run the file");
        let row = transaction
            .query_one(
                "SELECT pg_get_functiondef(format('%I.%I', $2::text, $1::text)::regproc),
                        pg_get_functiondef(format('drift_check.%I', $1::text)::regproc)",
                &[&file.name, &schema],
            )
            .await
            .expect("both definitions");
        let (installed, from_file): (String, String) = (row.get(0), row.get(1));
        assert_eq!(
            installed,
            from_file.replace("drift_check.", &format!("{schema}.")),
            "the database's {} differs from {}",
            file.name,
            file.path()
        );
    }
    transaction.rollback().await.expect("rollback");

    let row = db
        .query_one("SELECT revision, digest FROM function_sets WHERE schema_name = $1", &[&schema])
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
                    to_regclass('function_sets') IS NULL,
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

/// A set of a newer build, as far as the trigger bindings go: its trigger functions, in a
/// schema of its own, recorded one revision on, and owning the bindings.
async fn add_newer_set(db: &tokio_postgres::Client, schema: &str) {
    let mut script = format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema}, public;
         INSERT INTO function_sets (schema_name, revision, digest, version)
         VALUES ('{schema}', {}, 'newer', '99.0.0');",
        REVISION + 1
    );
    let drops = db
        .query(
            "SELECT format('DROP TRIGGER %I ON %s;', tgname, tgrelid::regclass)
               FROM pg_trigger WHERE NOT tgisinternal",
            &[],
        )
        .await
        .expect("the bindings");
    for drop in drops {
        script.push_str(drop.get(0));
    }
    for file in FILES.iter().filter(|file| file.bindings().is_some()) {
        script.push_str(file.text);
        script.push(';');
    }
    script.push_str(&format!("SET search_path = {};", functions::search_path()));
    db.batch_execute(&script).await.expect("a newer set");
}

#[tokio::test]
async fn an_older_build_starts_beside_newer_functions_and_migrations_and_leaves_them_be() {
    let config = fresh_database().await;
    let db = connect(&config).await;
    add_newer_set(&db, "fairway_newer").await;
    // The newer build's migration, which this build does not carry.
    db.batch_execute(
        "ALTER TABLE jobs ADD COLUMN newer_column boolean;
         INSERT INTO fairway_schema_history (version, name, applied_on, checksum)
         VALUES (9999, 'newer_release', now()::text, '1');",
    )
    .await
    .expect("a newer migration");
    // This build's set gone, as on a database only the newer build had used.
    db.batch_execute(&format!(
        "DROP SCHEMA {0} CASCADE; DELETE FROM function_sets WHERE schema_name = '{0}';",
        functions::schema()
    ))
    .await
    .expect("drop this build's set");

    install(&config).await.expect("an older broker starts");

    assert_eq!(functions_in(&db, functions::schema()).await, every_file(), "its own set is back");
    assert_eq!(trigger_owners(&db).await, bindings_owned_by("fairway_newer"), "triggers stay");
    let history: i64 = db
        .query_one("SELECT count(*) FROM fairway_schema_history WHERE version = 9999", &[])
        .await
        .expect("history")
        .get(0);
    assert_eq!(history, 1, "the newer migration is still recorded");
}

#[tokio::test]
async fn histories_that_diverge_are_refused() {
    let config = fresh_database().await;
    let db = connect(&config).await;
    db.batch_execute(
        "INSERT INTO fairway_schema_history (version, name, applied_on, checksum)
         VALUES (9999, 'another_branch', now()::text, '1');
         DELETE FROM fairway_schema_history
          WHERE version = (SELECT max(version) FROM fairway_schema_history WHERE version < 9999);",
    )
    .await
    .expect("a diverging history");
    let error = install(&config).await.expect_err("refused");
    assert!(
        matches!(&error, DbError::DivergentMigrations { unknown, missing }
            if unknown == "V9999__another_branch" && *missing == migrations::latest()),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_newest_set_unused_is_dropped_and_the_triggers_come_back_to_this_build() {
    let config = fresh_database().await;
    let mut db = connect(&config).await;
    add_newer_set(&db, "fairway_newer").await;
    // An older set beside them, unused for two hours.
    db.batch_execute(&format!(
        "CREATE SCHEMA fairway_older;
         INSERT INTO function_sets (schema_name, revision, digest, version, last_used_at)
         VALUES ('fairway_older', {}, 'older', '0.0.1', now() - interval '2 hours');",
        REVISION - 1
    ))
    .await
    .expect("an older set");

    // The newer set is still in use: only the older one goes.
    let dropped =
        migrations::prune_function_sets(&mut db, Duration::from_secs(3600)).await.expect("prune");
    assert_eq!(dropped, ["fairway_older"]);
    assert_eq!(trigger_owners(&db).await, bindings_owned_by("fairway_newer"));

    // Once nobody has used the newer set for the retention, it goes, and this build's set
    // takes the bindings over.
    db.execute(
        "UPDATE function_sets SET last_used_at = now() - interval '2 hours'
          WHERE schema_name = 'fairway_newer'",
        &[],
    )
    .await
    .expect("unused");
    let dropped =
        migrations::prune_function_sets(&mut db, Duration::from_secs(3600)).await.expect("prune");
    assert_eq!(dropped, ["fairway_newer"]);
    assert_eq!(trigger_owners(&db).await, bindings_owned_by(functions::schema()));
    let schemas: Vec<String> = db
        .query("SELECT schema_name FROM function_sets", &[])
        .await
        .expect("sets")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(schemas, [functions::schema()]);
    let gone: bool = db
        .query_one("SELECT to_regnamespace('fairway_newer') IS NULL", &[])
        .await
        .expect("look")
        .get(0);
    assert!(gone, "the schema is dropped with its row");

    // This build's own set never goes, however long unused.
    db.execute("UPDATE function_sets SET last_used_at = now() - interval '2 days'", &[])
        .await
        .expect("unused");
    let dropped =
        migrations::prune_function_sets(&mut db, Duration::from_secs(3600)).await.expect("prune");
    assert!(dropped.is_empty(), "{dropped:?}");
}

/// Release 0.1.0 kept its one set in public and bound the triggers to it; its brokers keep
/// calling it while a roll goes on, so it stays, and the bindings move to this build's set.
#[tokio::test]
async fn the_set_release_0_1_0_left_in_public_stays_and_gives_up_the_triggers() {
    let config = fresh_database().await;
    let db = connect(&config).await;
    let mut script = format!(
        "DROP SCHEMA {0} CASCADE; DELETE FROM function_sets WHERE schema_name = '{0}';
         SET search_path = public;",
        functions::schema()
    );
    for file in FILES {
        script.push_str(file.text);
        script.push(';');
    }
    db.batch_execute(&script).await.expect("0.1.0's set, as it installed it");
    assert_eq!(trigger_owners(&db).await, bindings_owned_by("public"));

    install(&config).await.expect("a broker of this build starts");

    assert_eq!(functions_in(&db, "public").await, every_file(), "0.1.0's functions stay");
    assert_eq!(functions_in(&db, functions::schema()).await, every_file());
    assert_eq!(trigger_owners(&db).await, bindings_owned_by(functions::schema()));
}

#[tokio::test]
async fn the_same_schema_with_other_text_is_refused() {
    let config = fresh_database().await;
    let db = connect(&config).await;
    db.execute("UPDATE function_sets SET digest = 'another build'", &[]).await.expect("set");
    let before = function_oids_and_install_time(&db).await;

    let error = install(&config).await.expect_err("refused");
    assert!(
        matches!(&error, DbError::FunctionsDiffer { schema } if schema == functions::schema()),
        "{error:?}"
    );
    assert_eq!(function_oids_and_install_time(&db).await, before, "nothing was replaced");
}

async fn function_oids_and_install_time(db: &tokio_postgres::Client) -> (Vec<u32>, String) {
    let oids = db
        .query(
            "SELECT p.oid FROM pg_proc p WHERE p.pronamespace = $1::text::regnamespace ORDER BY p.oid",
            &[&functions::schema()],
        )
        .await
        .expect("oids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let installed_at = db
        .query_one(
            "SELECT installed_at::text FROM function_sets WHERE schema_name = $1",
            &[&functions::schema()],
        )
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
    let sets = &answer["database"]["function_sets"];
    let expected = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "functions_revision": REVISION,
        "functions_schema": functions::schema(),
        "schema_migration": latest,
        "database": {
            "schema_migration": latest,
            "function_sets": [{
                "schema": functions::schema(),
                "revision": REVISION,
                "version": env!("CARGO_PKG_VERSION"),
                "installed_at": sets[0]["installed_at"],
                "last_used_at": sets[0]["last_used_at"],
                "owns_triggers": true,
            }],
        },
    });
    assert_eq!(answer, expected);
    assert!(sets[0]["last_used_at"].is_string(), "{answer}");

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
