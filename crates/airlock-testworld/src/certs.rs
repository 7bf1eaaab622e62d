//! Test certificates, made with openssl (P-256 keys): self-signed server certificates, and a
//! CA with the certificates it signs (for servers, clients, or both; valid, or expired). The
//! one place the test suites make certificates: the world's TLS server, the daemon's TLS and
//! node-to-node (mutual TLS) tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate and its private key, PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Issued {
    /// The paths as strings (for configuration files).
    pub fn paths(&self) -> (String, String) {
        (
            self.cert.display().to_string(),
            self.key.display().to_string(),
        )
    }
}

/// What a certificate may be used for (its extended key usage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
    ServerAndClient,
}

impl Usage {
    fn extended_key_usage(self) -> &'static str {
        match self {
            Usage::Server => "serverAuth",
            Usage::Client => "clientAuth",
            Usage::ServerAndClient => "serverAuth,clientAuth",
        }
    }
}

/// Runs openssl in `dir`; its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("cannot run openssl: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "openssl {} failed: {}",
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(())
}

const NEW_KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

fn path_text(path: &Path) -> String {
    path.display().to_string()
}

/// A self-signed certificate `<name>.pem` (key `<name>.key`) in `dir` for `subject` and the
/// `subject_alt_names` (`DNS:a.test`, `IP:127.0.0.1`), valid for two days. With a `usage`
/// it is marked a leaf (not a CA) for that usage, as rustls wants of a certificate that is
/// both the server's and the trusted one; without, it has openssl's default extensions.
pub fn self_signed(
    dir: &Path,
    name: &str,
    subject: &str,
    subject_alt_names: &[String],
    usage: Option<Usage>,
) -> Result<Issued, String> {
    let issued = Issued {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
    };
    let (cert, key) = (path_text(&issued.cert), path_text(&issued.key));
    let alt_names = format!("subjectAltName={}", subject_alt_names.join(","));
    let subject = format!("/CN={subject}");
    let mut args = vec!["req", "-x509"];
    args.extend(NEW_KEY);
    args.extend(["-nodes", "-days", "2", "-subj", &subject]);
    args.extend(["-addext", &alt_names, "-keyout", &key, "-out", &cert]);
    let extended = usage.map(|u| format!("extendedKeyUsage={}", u.extended_key_usage()));
    if let Some(extended) = &extended {
        args.extend(["-addext", "basicConstraints=critical,CA:FALSE"]);
        args.extend(["-addext", extended]);
    }
    openssl(dir, &args)?;
    Ok(issued)
}

/// A certificate authority of a test, its files in a directory of the test's.
#[derive(Debug, Clone)]
pub struct TestCa {
    dir: PathBuf,
    name: String,
    /// The CA's certificate: what a verifier trusts.
    pub cert: PathBuf,
    key: PathBuf,
}

impl TestCa {
    /// Makes the CA `<name>-ca.pem` (key `<name>-ca.key`) in `dir`, valid for two days.
    pub fn new(dir: &Path, name: &str) -> Result<TestCa, String> {
        let ca = TestCa {
            dir: dir.to_path_buf(),
            name: name.to_string(),
            cert: dir.join(format!("{name}-ca.pem")),
            key: dir.join(format!("{name}-ca.key")),
        };
        let (cert, key) = (path_text(&ca.cert), path_text(&ca.key));
        let subject = format!("/CN=airlock test CA {name}");
        let mut args = vec!["req", "-x509"];
        args.extend(NEW_KEY);
        args.extend(["-nodes", "-days", "2", "-subj", &subject]);
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign"]);
        args.extend(["-keyout", &key, "-out", &cert]);
        openssl(dir, &args)?;
        Ok(ca)
    }

    /// The CA certificate's path as a string.
    pub fn cert_path(&self) -> String {
        path_text(&self.cert)
    }

    /// Signs a certificate `<ca>-<leaf>.pem` (key `.key`) for the `subject_alt_names`, valid
    /// for two days.
    pub fn issue(
        &self,
        leaf: &str,
        subject_alt_names: &[&str],
        usage: Usage,
    ) -> Result<Issued, String> {
        self.sign(leaf, subject_alt_names, usage, "2")
    }

    /// As [`TestCa::issue`], but expired: its validity ended a day before it was made.
    pub fn issue_expired(
        &self,
        leaf: &str,
        subject_alt_names: &[&str],
        usage: Usage,
    ) -> Result<Issued, String> {
        self.sign(leaf, subject_alt_names, usage, "-1")
    }

    fn sign(
        &self,
        leaf: &str,
        subject_alt_names: &[&str],
        usage: Usage,
        days: &str,
    ) -> Result<Issued, String> {
        let file = |suffix: &str| self.dir.join(format!("{}-{leaf}.{suffix}", self.name));
        let issued = Issued {
            cert: file("pem"),
            key: file("key"),
        };
        let (csr, extensions) = (file("csr"), file("ext.cnf"));
        let lines = format!(
            "subjectAltName={}\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage={}\n",
            subject_alt_names.join(","),
            usage.extended_key_usage()
        );
        std::fs::write(&extensions, lines).map_err(|e| e.to_string())?;
        let (cert, key, csr_text) = (
            path_text(&issued.cert),
            path_text(&issued.key),
            path_text(&csr),
        );
        let subject = format!("/CN=airlock test {leaf}");
        let mut request = vec!["req", "-new"];
        request.extend(NEW_KEY);
        request.extend([
            "-nodes", "-subj", &subject, "-keyout", &key, "-out", &csr_text,
        ]);
        openssl(&self.dir, &request)?;
        let (ca_cert, ca_key, ext) = (
            path_text(&self.cert),
            path_text(&self.key),
            path_text(&extensions),
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr_text,
                "-CA",
                &ca_cert,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                days,
                "-extfile",
                &ext,
                "-out",
                &cert,
            ],
        )?;
        Ok(issued)
    }
}
