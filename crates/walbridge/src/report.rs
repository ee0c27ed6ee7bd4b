//! Errors as people read them.

/// An error and its causes, outermost first, joined with `: `. A cause
/// whose text an outer message already includes is left out: many errors
/// print their cause in their own message as well as returning it as
/// their source, and a line that says the same thing twice is harder to
/// act on.
pub fn describe(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || message.contains(text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(text);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_already_told_are_left_out() {
        let io = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        );
        let error = anyhow::Error::new(io)
            .context("error connecting to server: Connection refused (os error 111)")
            .context("source `shop`");
        assert_eq!(
            describe(&error),
            "source `shop`: error connecting to server: Connection refused (os error 111)"
        );
        let error = anyhow::anyhow!("failed to fill whole buffer")
            .context("failed to fill whole buffer")
            .context("cannot read segment 0");
        assert_eq!(
            describe(&error),
            "cannot read segment 0: failed to fill whole buffer"
        );
    }
}
