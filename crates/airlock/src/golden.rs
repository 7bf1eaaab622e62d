//! Golden-file assertions for the pure generators (OCI specs, engine command lines, SBPL
//! profiles). `AIRLOCK_UPDATE_GOLDEN=1` rewrites the files; review the diff before committing.

use std::path::Path;

/// Asserts that `rendered` equals `tests/golden/<dir>/<name>`, or writes it there when
/// `AIRLOCK_UPDATE_GOLDEN` is set.
pub(crate) fn assert_golden(dir: &str, name: &str, rendered: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(dir)
        .join(name);
    if std::env::var_os("AIRLOCK_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (set AIRLOCK_UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert_eq!(
        rendered,
        expected,
        "{} differs; review and set AIRLOCK_UPDATE_GOLDEN=1 to accept",
        path.display()
    );
}
