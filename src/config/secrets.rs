//! Secrets read from files (`store.username_file`, `store.password_file`,
//! `auth.admin_token_file`, `auth.check_token_file`): a Kubernetes Secret mounted as files
//! supplies them without putting them in the environment. Each is read once, at load; a file
//! and its inline form together are refused, so that which one applies is never a guess.

use std::path::Path;

use super::{ConfigError, Secret, Settings};

impl Settings {
    /// Reads every `*_file` secret into its inline key. A message names the key and the file,
    /// never the content.
    pub(super) fn read_secret_files(&mut self) -> Result<(), ConfigError> {
        let st = &mut self.store;
        if let Some(f) = &st.username_file {
            refuse_both("store.username", st.username.is_some())?;
            st.username = Some(read("store.username_file", f)?);
        }
        if let Some(f) = &st.password_file {
            refuse_both("store.password", st.password.is_some())?;
            st.password = Some(Secret::new(read("store.password_file", f)?));
        }
        let auth = &mut self.auth;
        if let Some(f) = &auth.admin_token_file {
            refuse_both("auth.admin_token", !auth.admin_token.is_empty())?;
            auth.admin_token = Secret::new(read("auth.admin_token_file", f)?);
        }
        if let Some(f) = &auth.check_token_file {
            refuse_both("auth.check_token", !auth.check_token.is_empty())?;
            auth.check_token = Secret::new(read("auth.check_token_file", f)?);
        }
        Ok(())
    }
}

fn refuse_both(key: &str, inline_set: bool) -> Result<(), ConfigError> {
    if inline_set {
        return Err(ConfigError(format!(
            "{key}: set either {key} or {key}_file, not both"
        )));
    }
    Ok(())
}

/// The file's content less one trailing newline (`\n` or `\r\n`); empty is refused.
fn read(key: &str, path: &Path) -> Result<String, ConfigError> {
    let s = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("{key}: cannot read {}: {e}", path.display())))?;
    let s = s.strip_suffix('\n').unwrap_or(&s);
    let s = s.strip_suffix('\r').unwrap_or(s);
    if s.is_empty() {
        return Err(ConfigError(format!("{key}: {} is empty", path.display())));
    }
    Ok(s.to_owned())
}
