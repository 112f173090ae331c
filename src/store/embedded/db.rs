//! The handle every part of the embedded store shares ([`Db`]): the redb database, and the way
//! the parts run their blocking work on it, off the async executor.

use std::ops::Deref;
use std::sync::Arc;

use redb::{Database, ReadableDatabase};

use super::err;
use crate::store::{StoreError, StoreResult};

/// The database, cheap to clone: every part holds one.
#[derive(Clone)]
pub(super) struct Db(Arc<Database>);

impl Db {
    pub(super) fn new(db: Database) -> Self {
        Db(Arc::new(db))
    }

    /// Runs blocking redb work off the async executor.
    pub(super) async fn blocking<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> StoreResult<T> + Send + 'static,
    {
        let db = self.0.clone();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }

    /// Succeeds while a read transaction can begin.
    pub(super) async fn ping(&self) -> StoreResult<()> {
        self.blocking(move |db| db.begin_read().map(|_| ()).map_err(err))
            .await
    }
}

impl Deref for Db {
    type Target = Database;

    fn deref(&self) -> &Database {
        &self.0
    }
}
