//! Errors as people read them.

/// An error and its causes, outermost first, joined with `: `. A cause
/// whose text an outer message already includes is left out: many errors
/// print their cause in their own message as well as returning it as
/// their source, and a line that says the same thing twice is harder to
/// act on.
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = String::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        next = cause.source();
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

    /// An error with a message and an optional cause.
    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1
                .as_deref()
                .map(|l| l as &(dyn std::error::Error + 'static))
        }
    }

    fn chain(messages: &[&'static str]) -> Layer {
        messages
            .iter()
            .rev()
            .fold(None, |cause, m| Some(Layer(m, cause.map(Box::new))))
            .unwrap_or(Layer("", None))
    }

    #[test]
    fn causes_already_told_are_left_out() {
        let error = chain(&[
            "source `shop`",
            "error connecting to server: Connection refused (os error 111)",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(
            describe(&error),
            "source `shop`: error connecting to server: Connection refused (os error 111)"
        );
        let error = chain(&[
            "cannot read segment 0",
            "failed to fill whole buffer",
            "failed to fill whole buffer",
        ]);
        assert_eq!(
            describe(&error),
            "cannot read segment 0: failed to fill whole buffer"
        );
    }
}
