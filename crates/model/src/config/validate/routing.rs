//! `[routing]`: the answer stage, the critic rule and the thresholds.

use super::super::{ConfigError, LoadedConfig};

impl LoadedConfig {
    /// The answer stage and the critic rule name stages that exist and fit.
    pub(super) fn validate_routing_stages(&self) -> Result<(), ConfigError> {
        let stages = &self.config.stages;
        let r = &self.config.routing;
        let find = |n: &str| stages.iter().find(|s| s.name == n);
        if let Some(a) = &r.answer_stage {
            match find(a) {
                Some(s) if !s.is_critic() => {}
                Some(_) => {
                    return Err(self.invalid_at_text(
                        "answer_stage",
                        "routing.answer_stage",
                        format!("\"{a}\" is a critic; the answer stage is the one a critic judges"),
                    ));
                }
                None => {
                    return Err(self.invalid_at_text(
                        "answer_stage",
                        "routing.answer_stage",
                        format!("no stage named \"{a}\""),
                    ));
                }
            }
        }
        if let Some(rule) = &r.critic {
            if let Some(c) = &rule.stage {
                match find(c) {
                    Some(s) if s.is_critic() => {}
                    Some(_) => {
                        return Err(self.invalid_at_text(
                            "[routing.critic]",
                            "routing.critic.stage",
                            format!("\"{c}\" is not a critic (it has no critic_of)"),
                        ));
                    }
                    None => {
                        return Err(self.invalid_at_text(
                            "[routing.critic]",
                            "routing.critic.stage",
                            format!("no stage named \"{c}\""),
                        ));
                    }
                }
            } else if self.critic_stage().is_none() {
                return Err(self.invalid_at_text(
                    "[routing.critic]",
                    "routing.critic",
                    format!(
                        "no stage is a critic of the answer stage \"{}\" (give it one with critic_of, or name the critic in routing.critic.stage)",
                        self.answer_stage().name
                    ),
                ));
            }
            if rule.agree.is_empty() {
                return Err(self.invalid_at_text(
                    "agree",
                    "routing.critic.agree",
                    "list at least one verdict that means the critic agrees",
                ));
            }
        }
        Ok(())
    }

    pub(super) fn validate_thresholds(&self) -> Result<(), ConfigError> {
        let r = &self.config.routing;
        for (v, k) in [
            (&r.auto_accept_threshold, "routing.auto_accept_threshold"),
            (&r.review_threshold, "routing.review_threshold"),
            (&r.audit_accept_share, "routing.audit_accept_share"),
            (&r.audit_reject_share, "routing.audit_reject_share"),
        ] {
            if !(0.0..=1.0).contains(v.get_ref()) {
                return Err(self.invalid(
                    v,
                    k,
                    format!("{} is out of range (0.0 to 1.0)", v.get_ref()),
                ));
            }
        }
        let target = *r.target_precision.get_ref();
        if !(target > 0.0 && target <= 1.0) {
            return Err(self.invalid(
                &r.target_precision,
                "routing.target_precision",
                format!("{target} is out of range (above 0.0, at most 1.0)"),
            ));
        }
        if r.review_threshold.get_ref() > r.auto_accept_threshold.get_ref() {
            return Err(self.invalid(
                &r.review_threshold,
                "routing.review_threshold",
                format!(
                    "{} is above auto_accept_threshold {}",
                    r.review_threshold.get_ref(),
                    r.auto_accept_threshold.get_ref()
                ),
            ));
        }
        Ok(())
    }
}
