//! Reading a value from Prometheus text (a node's `/metrics`), as the chaos
//! checks, the bench and the fenced storage server's token bound do.

/// The value of the unlabelled sample `name` (a counter or a gauge), exactly:
/// tokens near 2^62 would be rounded by an `f64`, and the server prints
/// integers. The first such line whose value is an integer counts; `None`
/// if there is none.
pub fn value(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: the sample of exactly that name, not a longer name or a comment;
    /// large values are exact.
    #[test]
    fn the_named_sample_is_found() {
        let text = "# HELP fencelock_token_counter x\n# TYPE fencelock_token_counter gauge\n\
                    fencelock_token_counter_total 9\nfencelock_token_counter 42\n\
                    fencelock_wait_seconds_bucket{le=\"0.001\"} 3\n";
        assert_eq!(value(text, "fencelock_token_counter"), Some(42));
        assert_eq!(value(text, "fencelock_wait_seconds_bucket"), None, "labelled samples are not read");
        assert_eq!(value("other 1\n", "fencelock_token_counter"), None);
        assert_eq!(
            value("fencelock_token_counter 3848290697216000001\n", "fencelock_token_counter"),
            Some(3848290697216000001)
        );
    }
}
