//! The components built into the binary (the file, web, exec and cron tools and exec's
//! programs), kept deflated: together they are about 23 MB of WebAssembly and 8 MB deflated. A
//! component is inflated only when it is compiled (a first start, or a new engine
//! configuration); a warm start maps the compiled artifact the cache vouched for and never
//! touches these bytes. Each carries the SHA-256 of its inflated bytes, computed when it was
//! built, so loading one needs no hashing and compiling one checks that the bytes are the ones the
//! build recorded.

use std::borrow::Cow;
use std::io::Read as _;

/// One component embedded in the binary, deflated (RFC 1951).
#[derive(Debug)]
pub struct BundledComponent {
    stem: &'static str,
    deflated: &'static [u8],
    len: usize,
    sha256: &'static str,
}

impl BundledComponent {
    /// A component whose inflated bytes are `len` long with the lowercase hex SHA-256
    /// `sha256`. Made by the build script's generated code.
    #[doc(hidden)]
    pub const fn new(
        stem: &'static str,
        deflated: &'static [u8],
        len: usize,
        sha256: &'static str,
    ) -> Self {
        Self {
            stem,
            deflated,
            len,
            sha256,
        }
    }

    /// The artifact's file stem, e.g. `clawcage_file` or `coreutils`.
    pub fn stem(&self) -> &'static str {
        self.stem
    }

    /// The lowercase hex SHA-256 of the component's bytes.
    pub fn sha256(&self) -> &'static str {
        self.sha256
    }

    /// The size of the component's bytes, inflated.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the component has no bytes (never true of a built component).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many bytes of the binary it takes, deflated.
    pub fn deflated_len(&self) -> usize {
        self.deflated.len()
    }

    /// The component's bytes, inflated and checked against the length and digest recorded when
    /// it was built.
    pub fn bytes(&self) -> Result<Vec<u8>, DamagedComponent> {
        let damaged = |problem: String| DamagedComponent {
            stem: self.stem,
            problem,
        };
        let mut bytes = Vec::with_capacity(self.len);
        // One byte past the recorded length, so a stream that is too long is noticed.
        flate2::read::DeflateDecoder::new(self.deflated)
            .take(self.len as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| damaged(format!("it does not inflate ({error})")))?;
        if bytes.len() != self.len {
            return Err(damaged(format!(
                "it inflates to {} bytes, not the {} recorded at build time",
                bytes.len(),
                self.len
            )));
        }
        let digest = crate::cache::sha256_hex(&bytes);
        if digest != self.sha256 {
            return Err(damaged(format!(
                "its SHA-256 is {digest}, not the {} recorded at build time",
                self.sha256
            )));
        }
        Ok(bytes)
    }
}

/// A bundled component whose embedded bytes are not the ones its build recorded.
#[derive(Debug, thiserror::Error)]
#[error(
    "the bundled component `{stem}` is damaged in this clawcage binary: {problem}; reinstall clawcage"
)]
pub struct DamagedComponent {
    stem: &'static str,
    problem: String,
}

/// A component's code as the sandbox is given it: one built into the binary, or bytes read
/// from elsewhere (a plugin file, a test fixture).
#[derive(Debug, Clone, Copy)]
pub enum ComponentCode<'a> {
    /// Built into the binary.
    Bundled(&'static BundledComponent),
    /// WebAssembly component bytes.
    Bytes(&'a [u8]),
}

impl ComponentCode<'_> {
    /// The component's bytes: borrowed, or inflated when bundled.
    pub fn bytes(&self) -> Result<Cow<'_, [u8]>, DamagedComponent> {
        match self {
            ComponentCode::Bundled(bundled) => bundled.bytes().map(Cow::Owned),
            ComponentCode::Bytes(bytes) => Ok(Cow::Borrowed(bytes)),
        }
    }
}

impl From<&'static BundledComponent> for ComponentCode<'static> {
    fn from(bundled: &'static BundledComponent) -> Self {
        ComponentCode::Bundled(bundled)
    }
}

impl<'a> From<&'a [u8]> for ComponentCode<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        ComponentCode::Bytes(bytes)
    }
}

impl<'a> From<&'a Vec<u8>> for ComponentCode<'a> {
    fn from(bytes: &'a Vec<u8>) -> Self {
        ComponentCode::Bytes(bytes)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for ComponentCode<'a> {
    fn from(bytes: &'a [u8; N]) -> Self {
        ComponentCode::Bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use std::io::Write as _;

    use super::*;

    fn deflated(bytes: &[u8]) -> &'static [u8] {
        let mut encoder =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(bytes).unwrap();
        Box::leak(encoder.finish().unwrap().into_boxed_slice())
    }

    fn digest(bytes: &[u8]) -> &'static str {
        Box::leak(crate::cache::sha256_hex(bytes).into_boxed_str())
    }

    #[test]
    fn every_bundled_component_inflates_to_the_bytes_its_build_recorded() {
        for bundled in crate::components::bundled::ALL {
            let bytes = bundled.bytes().unwrap();
            assert_eq!(bytes.len(), bundled.len());
            assert_eq!(&bytes[..4], b"\0asm", "{} is WebAssembly", bundled.stem());
            assert!(
                bundled.deflated_len() < bundled.len(),
                "{} is stored smaller than it is",
                bundled.stem()
            );
        }
    }

    #[test]
    fn a_component_is_inflated_whole_and_checked() {
        let original = b"\0asm component bytes, repeated, repeated, repeated".repeat(100);
        let good = BundledComponent::new(
            "good",
            deflated(&original),
            original.len(),
            digest(&original),
        );
        assert_eq!(good.bytes().unwrap(), original);
    }

    #[test]
    fn bytes_other_than_the_recorded_ones_are_refused() {
        let original = b"\0asm the component".repeat(50);
        let other = b"\0asm another thing".repeat(50);
        let swapped = BundledComponent::new(
            "swapped",
            deflated(&other),
            original.len(),
            digest(&original),
        );
        let error = swapped.bytes().unwrap_err().to_string();
        assert!(error.contains("SHA-256"), "{error}");
        assert!(error.contains("reinstall clawcage"), "{error}");

        let longer = BundledComponent::new(
            "longer",
            deflated(&original),
            original.len() - 1,
            digest(&original),
        );
        let error = longer.bytes().unwrap_err().to_string();
        assert!(error.contains("not the"), "{error}");

        let garbage = BundledComponent::new(
            "garbage",
            b"\xff\xff\xff\xff not deflate",
            original.len(),
            digest(&original),
        );
        let error = garbage.bytes().unwrap_err().to_string();
        assert!(error.contains("damaged"), "{error}");
    }

    #[test]
    fn a_deflate_bomb_is_stopped_at_the_recorded_length() {
        let huge = vec![0_u8; 64 << 20];
        let bomb = BundledComponent::new("bomb", deflated(&huge), 1024, digest(&huge[..1024]));
        let error = bomb.bytes().unwrap_err().to_string();
        assert!(error.contains("1025 bytes"), "{error}");
    }
}
