//! A worker's `fetch` (python/airlock_worker.py) goes through the same gate under the
//! worker's allowlist: an allowed origin answers (GET, and POST with headers and a body), an
//! unlisted one is refused with the gate's reason, and a redirect is followed within its
//! origin only.

use crate::{allow_with_ranges, flags};

const WORKER: &str = r#"
import json, airlock_worker as aw
results = []
results.append(aw.fetch("https://allowed.test/").text().strip())
results.append(aw.fetch("https://allowed.test/echo", method="POST", headers={"X-Test": "1"}, body="abc").text().strip())
results.append(aw.fetch("https://allowed.test/redirect?https://allowed.test/echo").text().strip())
for url in ["https://other.test/", "http://other.test/", "https://allowed.test/redirect?https://other.test/"]:
    try:
        aw.fetch(url); results.append("fetched " + url)
    except aw.FetchRefused as e:
        results.append("refused " + e.reason)
    except aw.FetchError as e:
        results.append("error " + str(e).split(": ")[0].split(" ")[0])
with open(aw.output_path("results.json"), "w") as out:
    json.dump(results, out)
aw.done()
"#;

#[test]
fn a_workers_fetch_goes_through_the_gate_under_its_allowlist() {
    let Some(world) = crate::world() else { return };
    let dir = crate::support::shared_tempdir();
    let script = crate::support::write_file(dir.path(), "worker.py", WORKER);
    let python_dir = crate::support::repo_python_dir().canonicalize().unwrap();
    let out = world.dir.path().join("worker-out");
    let mut command = world.in_gate(crate::support::airlock_bin());
    command
        .args(["worker", "--resolver", airlock_testworld::RESOLVER])
        .args([
            "--ro",
            &world.ca(),
            "--ro",
            &dir.path().display().to_string(),
        ])
        .args(["--ro", &python_dir.display().to_string()])
        .args(flags(&[
            "--env",
            &format!("SSL_CERT_FILE={}", world.ca()),
            "--env",
            &format!("PYTHONPATH={}", python_dir.display()),
            "--out",
            &out.display().to_string(),
        ]))
        .args(allow_with_ranges(&["allowed.test"]))
        .args([
            "--",
            airlock_testworld::PYTHON,
            &script.display().to_string(),
        ]);
    let output = command.output().unwrap();
    let stdout = crate::support::stdout_text(&output);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}\n{}",
        crate::support::stderr_text(&output)
    );
    let results: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(
        results,
        [
            "sni=allowed.test",
            "POST /echo 3 bytes sni=allowed.test",
            "GET /echo host=allowed.test sni=allowed.test",
            "refused not_allowed",
            "refused not_allowed",
            "error redirect",
        ]
    );
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "result");
    assert_eq!(last["network"]["mode"], "allowlist", "{last:#}");
    let snis: Vec<String> = world.tls_snis();
    assert!(snis.iter().all(|s| s == "allowed.test"), "{snis:?}");
}
