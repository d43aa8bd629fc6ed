//! Validation of the handshake flood limits in `[limits]`.

use crate::file::LimitsSection;
use crate::validate::Checker;
use crate::{ConfigError, HandshakeLimits, HandshakeRate};

/// Upper bound of the counts: far above any real need, low enough that
/// no arithmetic on them can overflow.
const HUGE: usize = 100_000_000;

/// `0` turns a count limit off.
fn optional(c: &Checker<'_>, key: &str, v: usize) -> Result<Option<usize>, ConfigError> {
    match v {
        0 => Ok(None),
        n => c.within(key, n, 1, HUGE).map(Some),
    }
}

pub(crate) fn validate(c: &Checker<'_>, l: &LimitsSection) -> Result<HandshakeLimits, ConfigError> {
    let rate_per_source = match l.handshake_rate_per_source {
        0 => None,
        per_second => Some(HandshakeRate {
            per_second: c.within("limits.handshake_rate_per_source", per_second, 1, 1_000_000)?,
            // A bucket smaller than one token would refuse every handshake.
            burst: c.within(
                "limits.handshake_burst_per_source",
                l.handshake_burst_per_source,
                1,
                1_000_000,
            )?,
        }),
    };
    Ok(HandshakeLimits {
        rate_per_source,
        max_per_source: optional(
            c,
            "limits.max_handshakes_per_source",
            l.max_handshakes_per_source,
        )?,
        max_in_progress: optional(
            c,
            "limits.max_handshakes_in_progress",
            l.max_handshakes_in_progress,
        )?,
        source_prefix_v4: c.within("limits.source_prefix_v4", l.source_prefix_v4, 1, 32)?,
        source_prefix_v6: c.within("limits.source_prefix_v6", l.source_prefix_v6, 1, 128)?,
        max_tracked_sources: c.within(
            "limits.max_tracked_sources",
            l.max_tracked_sources,
            1024,
            HUGE,
        )?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn check(l: &LimitsSection) -> Result<HandshakeLimits, ConfigError> {
        validate(&Checker { origin: "t.toml" }, l)
    }

    #[test]
    fn defaults_are_on_and_sensible() {
        let h = check(&LimitsSection::default()).unwrap();
        assert_eq!(
            h.rate_per_source,
            Some(HandshakeRate {
                per_second: 100,
                burst: 500
            })
        );
        assert_eq!(h.max_per_source, Some(128));
        assert_eq!(h.max_in_progress, Some(5_000));
        assert_eq!((h.source_prefix_v4, h.source_prefix_v6), (32, 64));
        assert_eq!(h.max_tracked_sources, 100_000);
    }

    #[test]
    fn zero_turns_limits_off() {
        let l = LimitsSection {
            handshake_rate_per_source: 0,
            // Ignored while the rate is off.
            handshake_burst_per_source: 0,
            max_handshakes_per_source: 0,
            max_handshakes_in_progress: 0,
            ..LimitsSection::default()
        };
        let h = check(&l).unwrap();
        assert_eq!(
            (h.rate_per_source, h.max_per_source, h.max_in_progress),
            (None, None, None)
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let d = LimitsSection::default;
        let cases: Vec<(LimitsSection, &str)> = vec![
            (
                LimitsSection {
                    handshake_burst_per_source: 0,
                    ..d()
                },
                "limits.handshake_burst_per_source",
            ),
            (
                LimitsSection {
                    handshake_rate_per_source: 2_000_000,
                    ..d()
                },
                "limits.handshake_rate_per_source",
            ),
            (
                LimitsSection {
                    source_prefix_v4: 33,
                    ..d()
                },
                "limits.source_prefix_v4",
            ),
            (
                LimitsSection {
                    source_prefix_v6: 0,
                    ..d()
                },
                "limits.source_prefix_v6",
            ),
            (
                LimitsSection {
                    max_tracked_sources: 10,
                    ..d()
                },
                "limits.max_tracked_sources",
            ),
            (
                LimitsSection {
                    max_handshakes_in_progress: HUGE + 1,
                    ..d()
                },
                "limits.max_handshakes_in_progress",
            ),
        ];
        for (l, key) in cases {
            let e = check(&l).unwrap_err();
            assert_eq!(e.key, key, "{e}");
            assert_eq!(e.origin, "t.toml");
            assert!(e.problem.contains("expected a number from"), "{e}");
        }
    }
}
