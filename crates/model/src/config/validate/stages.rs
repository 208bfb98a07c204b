//! `[[stages]]`: names, providers, limits, `[stages.batch]` and each
//! stage's place in the pipeline.

use std::collections::HashSet;

use super::super::{BatchConfig, ConfigError, LoadedConfig, ProviderKind, StageConfig};
use super::range_u64;

impl LoadedConfig {
    pub(super) fn validate_stages(&self) -> Result<(), ConfigError> {
        let c = &self.config;
        if c.stages.is_empty() {
            return Err(self.invalid_at_text(
                "stages",
                "stages",
                "at least one [[stages]] entry is required",
            ));
        }
        let mut names = HashSet::new();
        for (i, s) in c.stages.iter().enumerate() {
            self.validate_stage_identity(s, i, &mut names)?;
            self.validate_stage_limits(s, i)?;
            self.validate_pipeline(s, i)?;
        }
        Ok(())
    }

    /// A unique, plain name and a declared provider.
    fn validate_stage_identity<'a>(
        &self,
        s: &'a StageConfig,
        i: usize,
        names: &mut HashSet<&'a str>,
    ) -> Result<(), ConfigError> {
        let c = &self.config;
        let key = |k: &str| format!("stages[{i}].{k}");
        if !names.insert(s.name.as_str()) {
            return Err(self.invalid_at_text(
                &s.name,
                &key("name"),
                format!("duplicate stage name \"{}\"", s.name),
            ));
        }
        if s.name.is_empty()
            || !s
                .name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-')
        {
            return Err(self.invalid_at_text(
                "name",
                &key("name"),
                "use letters, digits, '_' or '-'",
            ));
        }
        if !c.providers.contains_key(&s.provider) {
            return Err(self.invalid_at_text(
                &format!("\"{}\"", s.provider),
                &key("provider"),
                format!(
                    "no provider named \"{}\" (declared: {})",
                    s.provider,
                    c.providers.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        Ok(())
    }

    fn validate_stage_limits(&self, s: &StageConfig, i: usize) -> Result<(), ConfigError> {
        let c = &self.config;
        let key = |k: &str| format!("stages[{i}].{k}");
        range_u64(self, &s.max_tokens, &key("max_tokens"), 1, 1_000_000)?;
        range_u64(self, &s.max_attempts, &key("max_attempts"), 1, 100)?;
        range_u64(
            self,
            &s.expected_output_tokens,
            &key("expected_output_tokens"),
            0,
            1_000_000,
        )?;
        self.validate_batch(&s.batch, i)?;
        if let Some(t) = &s.temperature
            && !(0.0..=2.0).contains(t.get_ref())
        {
            return Err(self.invalid(
                t,
                &key("temperature"),
                format!("{} is out of range (0 to 2)", t.get_ref()),
            ));
        }
        self.validate_provider_params(s, i)?;
        if let Some(t) = &s.temperature
            && *t.get_ref() > 1.0
            && c.providers.get(&s.provider).map(|p| p.kind) == Some(ProviderKind::Anthropic)
        {
            return Err(self.invalid(
                t,
                &key("temperature"),
                format!(
                    "{} is out of range for an anthropic provider (0 to 1)",
                    t.get_ref()
                ),
            ));
        }
        Ok(())
    }

    /// The parameters one provider kind reads: `thinking_budget` (Gemini,
    /// -1 to 32768: 2.5 Pro's most) and a `structured_output` other than
    /// `auto` (Anthropic). Elsewhere they would do nothing, so they are refused.
    fn validate_provider_params(&self, s: &StageConfig, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("stages[{i}].{k}");
        let kind = self.config.providers.get(&s.provider).map(|p| p.kind);
        if let Some(b) = &s.thinking_budget {
            let v = *b.get_ref();
            if kind != Some(ProviderKind::Gemini) {
                return Err(self.invalid(
                    b,
                    &key("thinking_budget"),
                    "only a gemini provider reads thinking_budget",
                ));
            }
            if !(-1..=32_768).contains(&v) {
                return Err(self.invalid(
                    b,
                    &key("thinking_budget"),
                    format!("{v} is out of range (-1 for dynamic, 0 to 32768)"),
                ));
            }
        }
        if !s.structured_output.is_auto() && kind != Some(ProviderKind::Anthropic) {
            return Err(self.invalid_at_text(
                "structured_output",
                &key("structured_output"),
                "only an anthropic provider reads structured_output (the others always send the schema as their own parameter)",
            ));
        }
        Ok(())
    }

    /// A stage's place in the pipeline: a critic judges an earlier stage
    /// that is not itself a critic; a repair prompt comes with its count;
    /// criteria are distinct names.
    fn validate_pipeline(&self, s: &StageConfig, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("stages[{i}].{k}");
        self.validate_critic_of(s, i)?;
        if s.wait_for_previous && i == 0 {
            return Err(self.invalid_at_text(
                "wait_for_previous",
                &key("wait_for_previous"),
                "the first stage has no previous stage to wait for",
            ));
        }
        self.validate_repair(s, i)?;
        self.validate_criteria(s, i)
    }

    /// A critic judges an earlier stage that is not itself a critic.
    fn validate_critic_of(&self, s: &StageConfig, i: usize) -> Result<(), ConfigError> {
        let stages = &self.config.stages;
        let key = |k: &str| format!("stages[{i}].{k}");
        if let Some(of) = &s.critic_of {
            match stages.iter().position(|x| &x.name == of) {
                Some(j) if j < i && !stages[j].is_critic() => {}
                Some(j) if j < i => {
                    return Err(self.invalid_at_text(
                        "critic_of",
                        &key("critic_of"),
                        format!("\"{of}\" is itself a critic; a critic judges a stage that is not"),
                    ));
                }
                Some(_) => {
                    return Err(self.invalid_at_text(
                        "critic_of",
                        &key("critic_of"),
                        format!("\"{of}\" does not come before stage \"{}\"; a critic judges an earlier stage", s.name),
                    ));
                }
                None => {
                    return Err(self.invalid_at_text(
                        "critic_of",
                        &key("critic_of"),
                        format!(
                            "no stage named \"{of}\" (stages: {})",
                            stages
                                .iter()
                                .map(|x| x.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A repair prompt comes with the count of gate failures that sends it.
    fn validate_repair(&self, s: &StageConfig, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("stages[{i}].{k}");
        match (&s.repair_after, &s.repair_template) {
            (Some(n), Some(_)) => {
                range_u64(self, n, &key("repair_after"), 1, 100)?;
                if *n.get_ref() >= *s.max_attempts.get_ref() {
                    return Err(self.invalid(
                        n,
                        &key("repair_after"),
                        format!(
                            "{} leaves no attempt for the repair prompt (max_attempts is {})",
                            n.get_ref(),
                            s.max_attempts.get_ref()
                        ),
                    ));
                }
            }
            (Some(n), None) => {
                return Err(self.invalid(
                    n,
                    &key("repair_after"),
                    "needs repair_template (the prompt sent after that many gate failures)",
                ));
            }
            (None, Some(_)) => {
                return Err(self.invalid_at_text(
                    "repair_template",
                    &key("repair_template"),
                    "needs repair_after (after how many gate failures to send it)",
                ));
            }
            (None, None) => {}
        }
        Ok(())
    }

    fn validate_criteria(&self, s: &StageConfig, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("stages[{i}].{k}");
        let mut seen = HashSet::new();
        for c in &s.criteria {
            let ok = !c.is_empty() && c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
            if !ok || !seen.insert(c.as_str()) {
                return Err(self.invalid_at_text(
                    "criteria",
                    &key("criteria"),
                    format!("\"{c}\": criteria are distinct names of letters, digits and '_'"),
                ));
            }
        }
        Ok(())
    }

    fn validate_batch(&self, b: &BatchConfig, i: usize) -> Result<(), ConfigError> {
        let key = |k: &str| format!("stages[{i}].batch.{k}");
        range_u64(
            self,
            &b.min_batch_size,
            &key("min_batch_size"),
            1,
            10_000_000,
        )?;
        range_u64(
            self,
            &b.max_open_batches,
            &key("max_open_batches"),
            1,
            1_000,
        )?;
        if let Some(n) = &b.max_requests {
            range_u64(self, n, &key("max_requests"), 1, 10_000_000)?;
        }
        if let Some(n) = &b.max_bytes {
            range_u64(self, n, &key("max_bytes"), 1024, 1 << 40)?;
        }
        let w = *b.max_wait_secs.get_ref();
        if !(0.0..=86_400.0).contains(&w) {
            return Err(self.invalid(
                &b.max_wait_secs,
                &key("max_wait_secs"),
                format!("{w} is out of range (0 to 86400 seconds)"),
            ));
        }
        if let Some(p) = &b.poll_interval_secs {
            let x = *p.get_ref();
            if !(0.01..=3600.0).contains(&x) {
                return Err(self.invalid(
                    p,
                    &key("poll_interval_secs"),
                    format!("{x} is out of range (0.01 to 3600 seconds)"),
                ));
            }
        }
        if let Some(n) = &b.max_enqueued_tokens {
            range_u64(self, n, &key("max_enqueued_tokens"), 1, 1 << 50)?;
        }
        if let Some(p) = &b.stall_after_secs {
            let x = *p.get_ref();
            if !(1.0..=30.0 * 86_400.0).contains(&x) {
                return Err(self.invalid(
                    p,
                    &key("stall_after_secs"),
                    format!("{x} is out of range (1 to 2592000 seconds)"),
                ));
            }
        }
        Ok(())
    }
}
