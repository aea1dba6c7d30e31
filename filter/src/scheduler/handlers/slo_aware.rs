//! `slo-aware-profile-handler`: runs the SLO profile for requests that ask for
//! prediction-based scheduling and the default profile for the others. A request asks
//! with `x-prediction-based-scheduling: true`; `x-prediction-based-scheduling: false`
//! or `x-prediction-based-scheduling-off: true` opts out; without either header, a
//! request carrying an SLO header gets the SLO profile. Parameters: `defaultProfile`
//! ("default") and `sloProfile` ("slo"), which must name configured profiles.

use super::{Outcome, Scheduler};
use crate::config::validate::err;
use crate::config::{ConfigError, Params};
use crate::rng::Rng;
use crate::scheduler::{Cycle, Probe, ScheduleError};
use serde_json::Value;

/// The type name in `EndpointPickerConfig`.
pub const TYPE: &str = "slo-aware-profile-handler";
/// Its parameters.
pub const PARAMETERS: &[&str] = &["defaultProfile", "sloProfile"];

/// The handler.
#[derive(Debug, Clone, PartialEq)]
pub struct SloAware {
    /// The profile for requests without prediction-based scheduling.
    pub default_profile: String,
    /// The profile for requests with it.
    pub slo_profile: String,
}

impl SloAware {
    /// Builds the handler; `profiles` are the configured profiles' names.
    pub fn from_parameters(v: &Value, path: &str, profiles: &[&str]) -> Result<Self, ConfigError> {
        let p = Params::new(Some(v), path, PARAMETERS)?;
        let default_profile = p.string("defaultProfile", "default")?;
        let slo_profile = p.string("sloProfile", "slo")?;
        for (field, name) in [
            ("defaultProfile", &default_profile),
            ("sloProfile", &slo_profile),
        ] {
            if !profiles.contains(&name.as_str()) {
                return Err(err(
                    &p.path(field),
                    format!(
                        "no scheduling profile is named \"{name}\" (profiles: {})",
                        profiles.join(", ")
                    ),
                ));
            }
        }
        Ok(Self {
            default_profile,
            slo_profile,
        })
    }

    /// Runs the profile the request selects.
    pub fn run(
        &self,
        scheduler: &Scheduler,
        cx: &Cycle<'_>,
        rng: &mut Rng,
        probe: &mut Probe<'_>,
    ) -> Result<Outcome, ScheduleError> {
        let slo = cx
            .request
            .prediction_based
            .unwrap_or_else(|| cx.request.slo.any());
        let name = if slo {
            &self.slo_profile
        } else {
            &self.default_profile
        };
        let Some(profile) = scheduler.profile(name) else {
            return Err(ScheduleError::NoCandidates);
        };
        let primary = profile.run(cx, rng, probe)?;
        Ok(Outcome {
            primary,
            prefill: None,
            disaggregated: false,
            encoders: Vec::new(),
        })
    }
}

/// Reads the profile-selection headers: `x-prediction-based-scheduling` (true / false)
/// and `x-prediction-based-scheduling-off` (true means false); `None` when neither says.
pub fn parse_headers(on: Option<&str>, off: Option<&str>) -> Option<bool> {
    let flag = |v: Option<&str>| match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        Some("true" | "1" | "yes") => Some(true),
        Some("false" | "0" | "no") => Some(false),
        _ => None,
    };
    if flag(off) == Some(true) {
        return Some(false);
    }
    flag(on)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use wasm_bindgen_test::wasm_bindgen_test;

    #[wasm_bindgen_test(unsupported = test)]
    fn headers_select_or_skip_the_slo_profile() {
        assert_eq!(parse_headers(Some("true"), None), Some(true));
        assert_eq!(parse_headers(Some("False"), None), Some(false));
        assert_eq!(parse_headers(None, Some("true")), Some(false));
        assert_eq!(parse_headers(Some("true"), Some("true")), Some(false));
        assert_eq!(parse_headers(Some("maybe"), None), None);
        assert_eq!(parse_headers(None, None), None);
    }

    #[wasm_bindgen_test(unsupported = test)]
    fn profiles_must_exist() {
        let h = SloAware::from_parameters(&Value::Null, "p", &["default", "slo"]).unwrap();
        assert_eq!(h.slo_profile, "slo");
        let e = SloAware::from_parameters(&json!({"sloProfile": "fast"}), "p", &["default", "slo"])
            .unwrap_err();
        assert_eq!(e.path, "p.sloProfile");
    }
}
