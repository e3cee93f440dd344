//! The connection pool every duty of a broker draws from.
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use fairway_pg::Database;

use super::DbError;

/// How long a request waits for a pooled connection before it is told the database is
/// unavailable (503), rather than hanging.
const CONNECTION_WAIT: Duration = Duration::from_secs(10);

/// A pool of `size` connections to `database`, secured as its connection string says.
/// Connections are opened on demand.
pub fn connect(database: &Database, size: usize) -> Result<Pool, DbError> {
    let manager = Manager::from_config(
        database.config().clone(),
        database.tls(),
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
