//! Error text in the words of the GNU tools: the system's description of an I/O error without
//! Rust's ` (os error N)` suffix.

use std::io;

/// `error` as GNU tools print it, e.g. `No such file or directory`.
pub fn describe(error: &io::Error) -> String {
    let text = error.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_error_numbers_are_dropped() {
        let error = io::Error::from_raw_os_error(2);
        assert!(
            !describe(&error).contains("os error"),
            "{}",
            describe(&error)
        );
        let error = io::Error::other("corrupt deflate stream");
        assert_eq!(describe(&error), "corrupt deflate stream");
    }
}
