//! Small pure helpers on bytes and text shared by the tools.

/// Count the bytes equal to `needle` in `hay`, eight at a time (the target
/// has no SIMD by default, so this word-at-a-time count is the fast path for
/// scanning large files).
pub(crate) fn count_byte(hay: &[u8], needle: u8) -> u64 {
    const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    let pattern = u64::from_ne_bytes([needle; 8]);
    let mut words = hay.chunks_exact(8);
    let mut count: u64 = 0;
    for word in words.by_ref() {
        let mut bytes = [0_u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_ne_bytes(bytes) ^ pattern;
        // High bit of each byte set exactly where that byte of `x` is zero.
        let zero = !(((x & LOW7).wrapping_add(LOW7)) | x | LOW7);
        count += u64::from(zero.count_ones());
    }
    count + words.remainder().iter().filter(|&&b| b == needle).count() as u64
}

/// A size in bytes for people: `512 bytes`, `12.3 KB`, `1.2 MB`, `3.4 GB`
/// (decimal units).
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes == 1 {
        return "1 byte".to_string();
    }
    if bytes < 1000 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 999.95 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// "1 line" / "3 lines".
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Where `needle` occurs in `hay`, overlapping occurrences included
/// (Knuth–Morris–Pratt, linear in both lengths): the total count and the
/// first `keep` start offsets.
pub(crate) fn find_all(hay: &[u8], needle: &[u8], keep: usize) -> (u64, Vec<usize>) {
    let mut positions = Vec::new();
    if needle.is_empty() || needle.len() > hay.len() {
        return (0, positions);
    }
    // failure[i]: length of the longest proper border of needle[..=i].
    let mut failure = vec![0_usize; needle.len()];
    let mut k = 0;
    for i in 1..needle.len() {
        while k > 0 && needle[i] != needle[k] {
            k = failure[k - 1];
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        failure[i] = k;
    }
    let first = needle[0];
    let mut count: u64 = 0;
    let mut matched = 0;
    let mut i = 0;
    while i < hay.len() {
        if matched == 0 {
            // Skip quickly to the next byte that can start a match.
            match hay[i..].iter().position(|&b| b == first) {
                Some(skip) => i += skip,
                None => break,
            }
        }
        let b = hay[i];
        while matched > 0 && b != needle[matched] {
            matched = failure[matched - 1];
        }
        if b == needle[matched] {
            matched += 1;
        }
        if matched == needle.len() {
            count += 1;
            if positions.len() < keep {
                positions.push(i + 1 - needle.len());
            }
            matched = failure[matched - 1];
        }
        i += 1;
    }
    (count, positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_byte_matches_naive() {
        let samples: [&[u8]; 6] = [
            b"",
            b"\n",
            b"abc",
            b"a\nb\nc\n",
            b"\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
            b"line one\nline two\x00\xff\x8a\n\x0b\x0a\x09\x0a\x8a\x0a\x0a\x7f\x80x",
        ];
        for s in samples {
            let naive = s.iter().filter(|&&b| b == b'\n').count() as u64;
            assert_eq!(count_byte(s, b'\n'), naive, "{s:?}");
        }
        let mixed: Vec<u8> = (0..10_000_u32).map(|i| (i * 7 % 256) as u8).collect();
        for needle in [0_u8, 10, 128, 255] {
            let naive = mixed.iter().filter(|&&b| b == needle).count() as u64;
            assert_eq!(count_byte(&mixed, needle), naive);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(human_size(0), "0 bytes");
        assert_eq!(human_size(1), "1 byte");
        assert_eq!(human_size(999), "999 bytes");
        assert_eq!(human_size(1000), "1.0 KB");
        assert_eq!(human_size(1_234_567), "1.2 MB");
        assert_eq!(human_size(999_999), "1.0 MB");
        assert_eq!(human_size(200_000_000), "200.0 MB");
        assert_eq!(human_size(3_400_000_000), "3.4 GB");
    }

    #[test]
    fn find_all_counts_overlaps() {
        assert_eq!(find_all(b"hello world", b"o", 10), (2, vec![4, 7]));
        assert_eq!(find_all(b"aaaa", b"aa", 10), (3, vec![0, 1, 2]));
        assert_eq!(find_all(b"abc", b"abcd", 10), (0, vec![]));
        assert_eq!(find_all(b"abc", b"", 10), (0, vec![]));
        assert_eq!(find_all(b"abababab", b"abab", 1), (3, vec![0]));
        assert_eq!(find_all(b"xxaabaabaaby", b"aabaab", 10), (2, vec![2, 5]));
        assert_eq!(
            find_all(b"fn a() {}\nfn b() {}\n", b"fn b", 10),
            (1, vec![10])
        );
    }

    #[test]
    fn find_all_matches_naive() {
        let hay: Vec<u8> = (0..3000_u32)
            .map(|i| b"ab"[(i * i % 3 % 2) as usize])
            .collect();
        for needle in [&b"a"[..], b"ab", b"aba", b"abba", b"bbab", b"aabaa"] {
            let naive: Vec<usize> = (0..=hay.len() - needle.len())
                .filter(|&i| &hay[i..i + needle.len()] == needle)
                .collect();
            let (count, positions) = find_all(&hay, needle, usize::MAX);
            assert_eq!(count, naive.len() as u64);
            assert_eq!(positions, naive);
        }
    }
}
