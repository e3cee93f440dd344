//! Placeholder: the private PostgreSQL server.
