//! Everything that knows how to reach PostgreSQL: the pool, migrations, the LISTEN
//! connection and the private server used when no database URL is given.

pub mod embedded;
