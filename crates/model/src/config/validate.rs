//! Validation of a parsed docket.toml, section by section. The checks run in
//! a fixed order and the first failure is the error reported, so the order
//! here is part of what a user sees.

use toml::Spanned;

use super::{ConfigError, LoadedConfig};

mod providers;
mod review;
mod routing;
mod stages;

impl LoadedConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_providers()?;
        self.validate_stages()?;
        self.validate_routing_stages()?;
        self.validate_thresholds()?;
        self.validate_review()
    }
}

fn range_u64(
    cfg: &LoadedConfig,
    v: &Spanned<u64>,
    key: &str,
    min: u64,
    max: u64,
) -> Result<(), ConfigError> {
    let x = *v.get_ref();
    if x < min || x > max {
        return Err(cfg.invalid(v, key, format!("{x} is out of range ({min} to {max})")));
    }
    Ok(())
}
