//! Configuration: built-in defaults, then `config/default.toml` (if present), then the file
//! given with `--config`, then environment variables `QUOTAD__<SECTION>__<KEY>`.
//!
//! Every section refuses unknown keys and every value is checked, so a typo or a bad value
//! stops start-up with a message that names it. Durations read as `250ms`, `1s`, `10m` (a bare
//! number is milliseconds). Secrets never print: `Secret` shows `***` in logs and debug output.
//! Secrets can come from files too (`*_file` keys), read once at load.

use std::path::Path;

use serde::Deserialize;

mod auth;
mod secrets;
mod sections;
pub mod tokens;
mod validate;
mod values;

pub use auth::{AuthSettings, Role, TokenSettings};
pub use sections::{
    AuditSettings, FleetSettings, ForwardAuthSettings, GrpcSettings, HistorySettings,
    LimiterSettings, LogSettings, MetricsSettings, QuotaSettings, ResourceSource, ServerSettings,
    StoreKind, StoreSettings, SyncSettings, TlsSettings, TracesSettings, HEADER_BYTES_CEILING,
    SCYLLA_MAX_SYNC_DELAY_MS,
};
pub use values::{DurationMs, Secret};

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub auth: AuthSettings,
    pub sync: SyncSettings,
    pub quotas: QuotaSettings,
    pub limiter: LimiterSettings,
    pub fleet: FleetSettings,
    pub metrics: MetricsSettings,
    pub history: HistorySettings,
    pub audit: AuditSettings,
    pub forward_auth: ForwardAuthSettings,
    pub grpc: GrpcSettings,
    pub traces: TracesSettings,
    pub log: LogSettings,
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

/// The file read first when it exists (relative to the working directory).
pub const DEFAULT_FILE: &str = "config/default.toml";

impl Settings {
    /// `history.write_interval_ms`, or its default for the store's kind.
    pub fn history_write_interval(&self) -> std::time::Duration {
        let ms = self.history.write_interval_ms.map_or(
            match self.store.kind {
                StoreKind::Embedded => sections::EMBEDDED_HISTORY_INTERVAL_MS,
                StoreKind::Scylla => sections::SCYLLA_HISTORY_INTERVAL_MS,
            },
            |w| w.0,
        );
        std::time::Duration::from_millis(ms)
    }

    /// `sync.max_delay_ms`, or its default for the store's kind (see
    /// [`sections::SCYLLA_MAX_SYNC_DELAY_MS`]), never below the interval.
    pub fn sync_max_delay_ms(&self) -> u64 {
        let interval = self.sync.interval_ms.0;
        self.sync.max_delay_ms.map_or(
            match self.store.kind {
                StoreKind::Embedded => interval,
                StoreKind::Scylla => sections::SCYLLA_MAX_SYNC_DELAY_MS.max(interval),
            },
            |d| d.0,
        )
    }

    /// Loads the layers; `file` is the `--config` argument.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_from(file, std::env::vars())
    }

    /// As `load`, with the environment given (tests).
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut b = config::Config::builder();
        if Path::new(DEFAULT_FILE).exists() {
            b = b.add_source(config::File::from(Path::new(DEFAULT_FILE)).required(true));
        }
        if let Some(f) = file {
            if !f.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    f.display()
                )));
            }
            b = b.add_source(config::File::from(f).required(true));
        }
        let vars: config::Map<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("QUOTAD__"))
            .collect();
        b = b.add_source(
            config::Environment::with_prefix("QUOTAD")
                .separator("__")
                .source(Some(vars)),
        );
        let c = b
            .build()
            .map_err(|e| ConfigError(without_source_lines(&e.to_string())))?;
        let mut s: Settings = c
            .try_deserialize()
            .map_err(|e| ConfigError(e.to_string()))?;
        s.read_secret_files()?;
        s.validate()?;
        Ok(s)
    }
}

/// A configuration error's text without the lines of the file it quotes: a TOML syntax error
/// shows the line it could not read (`3 | admin_token = "...`), which may hold a secret. What
/// is left names the file, the line and column, and what is wrong.
fn without_source_lines(text: &str) -> String {
    let quoted = |l: &str| {
        let t = l.trim_start();
        let t = t
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .trim_start();
        t.starts_with('|')
    };
    let kept: Vec<&str> = text.lines().filter(|l| !quoted(l)).collect();
    kept.join(" ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests;
