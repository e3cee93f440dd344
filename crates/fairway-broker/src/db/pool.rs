//! The connection pool every duty of a broker draws from.
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use deadpool_postgres::{
    Connect, Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime,
};
use fairway_pg::{Database, Tls};
use tokio::task::JoinHandle;

use super::{functions, DbError};

/// How long a request waits for a pooled connection before it is told the database is
/// unavailable (503), rather than hanging.
const CONNECTION_WAIT: Duration = Duration::from_secs(10);

/// A pool of `size` connections to `database`, secured as its connection string says, that
/// find this build's server functions first (`functions::search_path`). Connections are
/// opened on demand.
pub fn connect(database: &Database, size: usize) -> Result<Pool, DbError> {
    let manager = Manager::from_connect(
        with_search_path(database.config()),
        ExplainedConnect { tls: database.tls() },
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    Pool::builder(manager)
        .max_size(size)
        // The connection used last is handed out first: the broker's batches then keep going
        // to the same few backends, whose caches are warm, rather than cycling through all of
        // them.
        .queue_mode(QueueMode::Lifo)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(CONNECTION_WAIT))
        .create_timeout(Some(CONNECTION_WAIT))
        .build()
        .map_err(|error| DbError::Pool(fairway_pg::describe(&error)))
}

/// `config` with this build's `search_path` added to the options it sends at connection.
pub fn with_search_path(config: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut config = config.clone();
    let setting = format!("-c search_path={}", functions::search_path());
    let options = match config.get_options() {
        Some(given) if !given.is_empty() => format!("{given} {setting}"),
        _ => setting,
    };
    config.options(&options);
    config
}

/// Opens the pool's connections as deadpool's own connector does, but logs a connection that
/// ends in error with its whole cause (the server's message and SQLSTATE, or the socket's),
/// where deadpool's says only "db error".
struct ExplainedConnect {
    tls: Tls,
}

type Connecting<'a> = Pin<
    Box<
        dyn Future<Output = Result<(tokio_postgres::Client, JoinHandle<()>), tokio_postgres::Error>>
            + Send
            + 'a,
    >,
>;

impl Connect for ExplainedConnect {
    fn connect(&self, config: &tokio_postgres::Config) -> Connecting<'_> {
        let (tls, config) = (self.tls.clone(), config.clone());
        Box::pin(async move {
            let (client, connection) = config.connect(tls).await?;
            let driver = tokio::spawn(async move {
                if let Err(error) = connection.await {
                    let cause = fairway_pg::describe(&error);
                    tracing::warn!(%cause, "a pooled database connection ended");
                }
            });
            Ok((client, driver))
        })
    }
}
