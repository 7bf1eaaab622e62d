//! The documentation says what the catalogue holds: docs/attacks.md's counts and results table
//! (attack, class, evidence, layers; the measured Tier 0 and untrusted columns are prose), and
//! docs/conformance.md's columns.

use std::path::Path;

use airlock_attack::program::PROGRAMS;
use airlock_attack::{catalogue, Group};

fn doc(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the first table after `heading`, as trimmed cells (header and rule skipped).
fn table_after(doc: &str, heading: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    doc[start..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|line| {
            let inner = line.trim().trim_start_matches('|').trim_end_matches('|');
            inner
                .split('|')
                .map(|cell| cell.trim().to_string())
                .collect()
        })
        .collect()
}

#[test]
fn the_results_table_is_the_catalogue_in_order() {
    let rows = table_after(&doc("attacks.md"), "## Results");
    let attacks = catalogue();
    let names = |rows: &[Vec<String>]| rows.iter().map(|r| r[0].clone()).collect::<Vec<_>>();
    let expected: Vec<String> = attacks.iter().map(|a| a.name.to_string()).collect();
    assert_eq!(
        names(&rows),
        expected,
        "docs/attacks.md lists other attacks"
    );
    for (row, attack) in rows.iter().zip(&attacks) {
        let class = format!("{:?}", attack.threat);
        assert_eq!(row.len(), 6, "{}: six columns", attack.name);
        assert_eq!(row[1], class, "{}: class", attack.name);
        assert_eq!(row[2], attack.evidence, "{}: evidence", attack.name);
        assert_eq!(row[5], attack.layers, "{}: layers", attack.name);
    }
}

#[test]
fn the_counts_in_attacks_md_are_the_catalogues() {
    let doc = doc("attacks.md");
    let attacks = catalogue();
    let count = attacks.len();
    for claim in [
        format!("lists {count} attacks"),
        format!("run {} attack programs", PROGRAMS.len()),
        format!("All {count} attacks are contained"),
    ] {
        assert!(doc.contains(&claim), "docs/attacks.md must say {claim:?}");
    }
    let root_only = attacks.iter().filter(|a| a.root_only.is_some()).count();
    let unprivileged = format!(
        "{} ({root_only} skipped: root-only checks)",
        count - root_only
    );
    for row in table_after(&doc, "## The backend matrix") {
        assert!(
            row[1] == count.to_string() || row[1] == unprivileged,
            "backend {}: stopped {:?}, not {count} or {unprivileged:?}",
            row[0],
            row[1]
        );
    }
}

#[test]
fn conformance_md_names_every_column() {
    let doc = doc("conformance.md");
    for group in Group::ALL {
        assert!(
            doc.contains(&format!("| {} |", group.name())),
            "docs/conformance.md must describe the column {}",
            group.name()
        );
    }
}

/// The backquoted names after "attack" or "attacks" in a "proved by" cell.
fn cited_attacks(proof: &str) -> Vec<String> {
    let mut cited = Vec::new();
    for after in proof.split("attack").skip(1) {
        let list = after.strip_prefix("s ").or_else(|| after.strip_prefix(' '));
        for item in list.unwrap_or_default().split(", ") {
            let Some(quoted) = item.strip_prefix('`') else {
                break;
            };
            cited.push(quoted.split('`').next().unwrap_or_default().to_string());
        }
    }
    cited
}

/// Every attack docs/threat-model.md's table cites as proof exists (`read_*`: some attack's
/// prefix).
#[test]
fn threat_model_md_cites_attacks_that_exist() {
    let names: Vec<&str> = catalogue().iter().map(|a| a.name).collect();
    let doc = doc("threat-model.md");
    let cited: Vec<String> = table_after(&doc, "## Threats")
        .iter()
        .filter_map(|row| row.last())
        .flat_map(|proof| cited_attacks(proof))
        .collect();
    for name in &cited {
        let exists = match name.strip_suffix('*') {
            Some(prefix) => names.iter().any(|n| n.starts_with(prefix)),
            None => names.contains(&name.as_str()),
        };
        assert!(exists, "docs/threat-model.md cites attack {name:?}");
    }
    assert!(
        cited.len() >= 30,
        "found only {} cited attacks",
        cited.len()
    );
}
