//! Placeholder until the scylla store lands (branch `scylla`).
use crate::config::Settings;
use crate::store::DynStore;

pub async fn open(_s: &Settings) -> Result<DynStore, String> {
    Err("the scylla store is not built into this binary yet".into())
}

pub async fn migrate(_s: &Settings, _dry_run: bool) -> Result<(), String> {
    Err("quotad migrate is not built into this binary yet".into())
}
