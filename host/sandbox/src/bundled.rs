//! The components built into the binary (the file, web, exec and cron tools and exec's
//! programs), kept compressed as LZMA2: together they are about 23 MB of WebAssembly and 5 MB
//! compressed. A component is decompressed only when it is compiled (a first start, or a new
//! engine configuration); a warm start maps the compiled artifact the cache vouched for and
//! never touches these bytes. Each carries the SHA-256 of its bytes, computed when it was built,
//! so loading one needs no hashing and compiling one checks that the bytes are the ones the build
//! recorded.

use std::borrow::Cow;
use std::io::Read as _;

/// One component embedded in the binary, as a raw LZMA2 stream.
#[derive(Debug)]
pub struct BundledComponent {
    stem: &'static str,
    compressed: &'static [u8],
    /// The LZMA2 dictionary it was compressed with (what decompressing it allocates).
    dictionary: u32,
    len: usize,
    sha256: &'static str,
}

impl BundledComponent {
    /// A component compressed with an LZMA2 `dictionary` whose bytes are `len` long with the
    /// lowercase hex SHA-256 `sha256`. Made by the build script's generated code.
    #[doc(hidden)]
    pub const fn new(
        stem: &'static str,
        compressed: &'static [u8],
        dictionary: u32,
        len: usize,
        sha256: &'static str,
    ) -> Self {
        Self {
            stem,
            compressed,
            dictionary,
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

    /// The size of the component's bytes (decompressed).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the component has no bytes (never true of a built component).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How many bytes of the binary it takes, compressed.
    pub fn compressed_len(&self) -> usize {
        self.compressed.len()
    }

    /// The component's bytes, decompressed and checked against the length and digest recorded
    /// when it was built.
    pub fn bytes(&self) -> Result<Vec<u8>, DamagedComponent> {
        let damaged = |problem: String| DamagedComponent {
            stem: self.stem,
            problem,
        };
        let mut bytes = Vec::with_capacity(self.len);
        // One byte past the recorded length, so a stream that is too long is noticed.
        lzma_rust2::Lzma2Reader::new(self.compressed, self.dictionary, None)
            .take(self.len as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| damaged(format!("it does not decompress ({error})")))?;
        if bytes.len() != self.len {
            return Err(damaged(format!(
                "it decompresses to {} bytes, not the {} recorded at build time",
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
    /// The component's bytes: borrowed, or decompressed when bundled.
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

    const DICTIONARY: u32 = 1 << 16;

    fn compressed(bytes: &[u8]) -> &'static [u8] {
        let mut options = lzma_rust2::Lzma2Options::with_preset(6);
        options.lzma_options.dict_size = DICTIONARY;
        let mut writer = lzma_rust2::Lzma2Writer::new(Vec::new(), options);
        writer.write_all(bytes).unwrap();
        Box::leak(writer.finish().unwrap().into_boxed_slice())
    }

    fn digest(bytes: &[u8]) -> &'static str {
        Box::leak(crate::cache::sha256_hex(bytes).into_boxed_str())
    }

    fn bundled(stem: &'static str, stored: &[u8], len: usize, of: &[u8]) -> BundledComponent {
        BundledComponent::new(stem, compressed(stored), DICTIONARY, len, digest(of))
    }

    #[test]
    fn every_bundled_component_decompresses_to_the_bytes_its_build_recorded() {
        for bundled in crate::components::bundled::ALL {
            let bytes = bundled.bytes().unwrap();
            assert_eq!(bytes.len(), bundled.len());
            assert_eq!(&bytes[..4], b"\0asm", "{} is WebAssembly", bundled.stem());
            assert!(
                bundled.compressed_len() < bundled.len() / 2,
                "{} is stored at less than half its size",
                bundled.stem()
            );
        }
    }

    #[test]
    fn a_component_is_decompressed_whole_and_checked() {
        let original = b"\0asm component bytes, repeated, repeated, repeated".repeat(100);
        let good = bundled("good", &original, original.len(), &original);
        assert_eq!(good.bytes().unwrap(), original);
        let good: &'static BundledComponent = Box::leak(Box::new(good));
        assert_eq!(*ComponentCode::from(good).bytes().unwrap(), original[..]);
    }

    #[test]
    fn bytes_other_than_the_recorded_ones_are_refused() {
        let original = b"\0asm the component".repeat(50);
        let other = b"\0asm another thing".repeat(50);
        let swapped = bundled("swapped", &other, original.len(), &original);
        let error = swapped.bytes().unwrap_err().to_string();
        assert!(error.contains("SHA-256"), "{error}");
        assert!(error.contains("reinstall clawcage"), "{error}");

        let longer = bundled("longer", &original, original.len() - 1, &original);
        let error = longer.bytes().unwrap_err().to_string();
        assert!(error.contains("not the"), "{error}");

        let garbage = BundledComponent::new(
            "garbage",
            b"\xff\xff\xff\xff not LZMA2",
            DICTIONARY,
            original.len(),
            digest(&original),
        );
        let error = garbage.bytes().unwrap_err().to_string();
        assert!(error.contains("damaged"), "{error}");
    }

    #[test]
    fn a_decompression_bomb_is_stopped_at_the_recorded_length() {
        let huge = vec![0_u8; 64 << 20];
        let bomb = bundled("bomb", &huge, 1024, &huge[..1024]);
        let error = bomb.bytes().unwrap_err().to_string();
        assert!(error.contains("1025 bytes"), "{error}");
    }
}
