//! How the broker runs its statements: each is a [`Statement`], a struct of its parameters in
//! the order its text numbers them, answering rows of a named [`FromRow`] type. Each duty
//! declares its own in its folder's `statements.rs`, beside their `.sql` files; a call of a
//! server function is declared with its text inline, since the function's file is the logic.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row};

/// Declares a `&str` constant per statement text, read at build time from `$folder`, a path
/// relative to the file that invokes the macro: for the tools' own statements.
#[macro_export]
macro_rules! statements {
    ($folder:literal; $($name:ident = $file:literal;)*) => {
        $(
            pub const $name: &str = include_str!(concat!($folder, $file, ".sql"));
        )*
    };
}

/// A statement the broker runs: its text, its parameters, and what one row of its answer is.
pub trait Statement {
    /// The file's text, as PostgreSQL prepares it.
    const SQL: &'static str;
    /// One row of the answer.
    type Row: FromRow;
    /// The parameters, `$1` first.
    fn params(&self) -> Vec<&(dyn ToSql + Sync)>;
}

/// A row type that knows its columns: the one place a statement's output is read by name.
pub trait FromRow: Sized {
    fn from_row(row: &Row) -> Result<Self, Error>;
}

/// For statements whose rows, if any, say nothing beyond their number.
impl FromRow for () {
    fn from_row(_: &Row) -> Result<Self, Error> {
        Ok(())
    }
}

/// Declares a statement: a struct of its parameters, in the order its text numbers them, and
/// its [`Statement`] impl. `= "name"` reads the text from `name.sql` beside the declaring file;
/// `= function "SELECT ..."` gives a server function's call inline.
macro_rules! statement {
    (
        $(#[$meta:meta])*
        $name:ident $(<$lt:lifetime>)? = $file:literal -> $row:ty { $($fields:tt)* }
    ) => {
        $crate::db::sql::statement! {
            @declare $(#[$meta])* $name $(<$lt>)?,
            include_str!(concat!($file, ".sql")), $row, { $($fields)* }
        }
    };
    (
        $(#[$meta:meta])*
        $name:ident $(<$lt:lifetime>)? = function $text:literal -> $row:ty { $($fields:tt)* }
    ) => {
        $crate::db::sql::statement! {
            @declare $(#[$meta])* $name $(<$lt>)?, $text, $row, { $($fields)* }
        }
    };
    (
        @declare $(#[$meta:meta])* $name:ident $(<$lt:lifetime>)?, $text:expr, $row:ty, {
            $($(#[$field_meta:meta])* $field:ident: $type:ty),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub struct $name $(<$lt>)? {
            $($(#[$field_meta])* pub $field: $type,)*
        }

        impl $(<$lt>)? $crate::db::sql::Statement for $name $(<$lt>)? {
            const SQL: &'static str = $text;
            type Row = $row;
            fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
                vec![$(&self.$field),*]
            }
        }
    };
}
pub(crate) use statement;

/// Declares a row type whose fields are named as the statement's columns.
macro_rules! row {
    (
        $(#[$meta:meta])*
        $name:ident { $($(#[$field_meta:meta])* $field:ident: $type:ty),* $(,)? }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$field_meta])* pub $field: $type,)*
        }

        impl $crate::db::sql::FromRow for $name {
            fn from_row(row: &tokio_postgres::Row) -> Result<Self, tokio_postgres::Error> {
                Ok(Self { $($field: row.try_get(stringify!($field))?,)* })
            }
        }
    };
}
pub(crate) use row;

/// Every row of the answer.
pub async fn fetch_all<S: Statement>(
    client: &impl GenericClient,
    statement: &S,
) -> Result<Vec<S::Row>, Error> {
    let prepared = client.prepare_cached(S::SQL).await?;
    decode(&client.query(&prepared, &statement.params()).await?)
}

/// The answer's row, if it has one; more than one is an error.
pub async fn fetch_opt<S: Statement>(
    client: &impl GenericClient,
    statement: &S,
) -> Result<Option<S::Row>, Error> {
    let prepared = client.prepare_cached(S::SQL).await?;
    client
        .query_opt(&prepared, &statement.params())
        .await?
        .as_ref()
        .map(S::Row::from_row)
        .transpose()
}

/// The answer's one row.
pub async fn fetch_one<S: Statement>(
    client: &impl GenericClient,
    statement: &S,
) -> Result<S::Row, Error> {
    let prepared = client.prepare_cached(S::SQL).await?;
    S::Row::from_row(&client.query_one(&prepared, &statement.params()).await?)
}

/// Runs the statement for its effect; returns how many rows it touched.
pub async fn run<S: Statement>(client: &impl GenericClient, statement: &S) -> Result<u64, Error> {
    let prepared = client.prepare_cached(S::SQL).await?;
    client.execute(&prepared, &statement.params()).await
}

/// Positional parameters, for the tools' own statements (the bench's and the fault suite's), which
/// are not [`Statement`]s: the broker's statements take their parameter structs.
pub type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// A tool's statement text, run as a cached prepared statement as the broker runs its own, so
/// that a baseline pays what the broker pays.
pub async fn query(
    client: &impl GenericClient,
    text: &str,
    params: Params<'_>,
) -> Result<Vec<Row>, Error> {
    let prepared = client.prepare_cached(text).await?;
    client.query(&prepared, params).await
}

/// As [`query`], for a statement that answers one row.
pub async fn query_one(
    client: &impl GenericClient,
    text: &str,
    params: Params<'_>,
) -> Result<Row, Error> {
    let prepared = client.prepare_cached(text).await?;
    client.query_one(&prepared, params).await
}

/// As [`query`], for a statement that answers at most one row.
pub async fn query_opt(
    client: &impl GenericClient,
    text: &str,
    params: Params<'_>,
) -> Result<Option<Row>, Error> {
    let prepared = client.prepare_cached(text).await?;
    client.query_opt(&prepared, params).await
}

/// As [`query`], for a statement run for its effect.
pub async fn execute(
    client: &impl GenericClient,
    text: &str,
    params: Params<'_>,
) -> Result<u64, Error> {
    let prepared = client.prepare_cached(text).await?;
    client.execute(&prepared, params).await
}

/// Rows already fetched, as `R`.
pub fn decode<R: FromRow>(rows: &[Row]) -> Result<Vec<R>, Error> {
    rows.iter().map(R::from_row).collect()
}

/// A duration as the whole milliseconds statements take it in (bigint), saturating.
pub fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
