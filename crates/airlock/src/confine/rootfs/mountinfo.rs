//! Reading `/proc/<pid>/mountinfo`, to find the submounts a recursive bind brought along.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// Mount points strictly below `dest`, in mount order (parents before children).
pub fn submounts_under(mountinfo: &str, dest: &Path) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|point| point != dest && point.starts_with(dest))
        .collect()
}

/// The kernel writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
fn unescape(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if let Some(byte) = octal_escape(&bytes[i..]) {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

fn octal_escape(bytes: &[u8]) -> Option<u8> {
    let [b'\\', digits @ ..] = bytes.get(..4)? else {
        return None;
    };
    digits.iter().try_fold(0u8, |acc, &d| match d {
        b'0'..=b'7' => acc.checked_mul(8)?.checked_add(d - b'0'),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
60 27 0:40 / /newroot/usr ro,nosuid,nodev,relatime - ext4 /dev/vda rw
61 60 0:41 / /newroot/usr/local ro,relatime - tmpfs tmpfs rw
62 27 0:42 / /newroot/usr2 rw - tmpfs tmpfs rw
63 61 0:43 / /newroot/usr/local/my\\040dir rw - tmpfs tmpfs rw
";

    #[test]
    fn submounts_are_strictly_below_and_component_wise() {
        let found = submounts_under(SAMPLE, Path::new("/newroot/usr"));
        assert_eq!(
            found,
            vec![
                PathBuf::from("/newroot/usr/local"),
                PathBuf::from("/newroot/usr/local/my dir"),
            ]
        );
    }

    #[test]
    fn no_submounts_for_a_leaf() {
        assert!(submounts_under(SAMPLE, Path::new("/proc")).is_empty());
    }

    #[test]
    fn unescape_leaves_plain_backslashes_alone() {
        assert_eq!(unescape("a\\b\\134c"), PathBuf::from("a\\b\\c"));
    }
}
