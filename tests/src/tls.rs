//! Throwaway certificates for TLS tests, made with the `openssl` command:
//! one CA per test, leaf certificates it signs for a server on
//! localhost/127.0.0.1 or for a named client.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A certificate authority whose files live in a directory of the test.
pub struct Authority {
    dir: PathBuf,
}

/// What a leaf certificate is for.
#[derive(Clone, Copy)]
pub enum Purpose {
    /// A server reached as `localhost` or `127.0.0.1`.
    Server,
    /// A client, named by its common name.
    Client,
}

/// A certificate and its private key, PEM files.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A new P-256 key in the `req` commands (fast to make, taken by rustls,
/// OpenSSL and BoringSSL alike).
const NEW_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

fn openssl(dir: &Path, args: &[&str]) {
    crate::succeeds(Command::new("openssl").args(args).current_dir(dir));
}

impl Authority {
    /// A new CA (`ca.crt`, `ca.key`) in `dir`, valid for two days.
    pub fn new(dir: &Path) -> Authority {
        openssl(
            dir,
            &[
                &["req", "-x509"][..],
                &NEW_KEY,
                &["-days", "2", "-subj", "/CN=walbridge test CA"],
                &["-keyout", "ca.key", "-out", "ca.crt"],
            ]
            .concat(),
        );
        Authority {
            dir: dir.to_path_buf(),
        }
    }

    /// The CA's certificate, for a peer to verify with.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A certificate signed by this CA, `<name>.crt` and `<name>.key` in
    /// its directory.
    pub fn issue(&self, name: &str, purpose: Purpose) -> Issued {
        let (subject, extensions) = match purpose {
            Purpose::Server => (
                "/CN=localhost".to_string(),
                "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
            ),
            Purpose::Client => (format!("/CN={name}"), "extendedKeyUsage=clientAuth\n"),
        };
        let ext = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&ext),
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n{extensions}"
            ),
        )
        .unwrap_or_else(|e| panic!("{ext}: {e}"));
        let (cert, key, csr) = (
            format!("{name}.crt"),
            format!("{name}.key"),
            format!("{name}.csr"),
        );
        openssl(
            &self.dir,
            &[
                &["req"][..],
                &NEW_KEY,
                &["-subj", &subject, "-keyout", &key, "-out", &csr],
            ]
            .concat(),
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &cert,
            ],
        );
        Issued {
            cert: self.dir.join(cert),
            key: self.dir.join(key),
        }
    }
}
