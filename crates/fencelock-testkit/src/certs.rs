//! Test certificates made at test time with rcgen: a CA, and a server
//! certificate it signs for `127.0.0.1` and `localhost`, written as PEM files
//! into a temporary directory that the server's user can read.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::shared_tempdir;

/// A CA and a server certificate signed by it, as files: `ca.pem`,
/// `server.pem`, `server.key` (and `client.pem`, `client.key`, a client
/// certificate of the same CA). Removed on drop.
pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// A fresh CA named `name`, with a server certificate for `127.0.0.1`
    /// and `localhost`.
    pub fn new(name: &str) -> TestCerts {
        let dir = shared_tempdir();
        let ca_params = ca_params(name);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key")).expect("CA");
        write(dir.path(), "ca.pem", &ca.pem());
        for (who, usage) in
            [("server", ExtendedKeyUsagePurpose::ServerAuth), ("client", ExtendedKeyUsagePurpose::ClientAuth)]
        {
            let key = KeyPair::generate().expect("key");
            let mut params =
                CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("params");
            params.distinguished_name.push(DnType::CommonName, format!("{name} {who}"));
            params.extended_key_usages = vec![usage];
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            let cert = params.signed_by(&key, &ca).expect("sign");
            write(dir.path(), &format!("{who}.pem"), &cert.pem());
            write(dir.path(), &format!("{who}.key"), &key.serialize_pem());
        }
        TestCerts { dir }
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The server certificate (PEM), for `127.0.0.1` and `localhost`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    /// The server's private key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// A client certificate (PEM) of the same CA.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The client certificate's key (PEM).
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// Gives the files to `uid:gid` (a server that runs as another user and
    /// refuses a key others can read: PostgreSQL), the key mode 0600.
    pub fn chown(&self, uid: u32, gid: u32) {
        for entry in fs::read_dir(self.dir.path()).expect("read cert dir").flatten() {
            std::os::unix::fs::chown(entry.path(), Some(uid), Some(gid)).expect("chown cert");
        }
    }
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

/// Writes `text` to `dir/file`; keys are 0600, certificates 0644.
fn write(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    fs::write(&path, text).expect("write cert");
    let mode = if file.ends_with(".key") { 0o600 } else { 0o644 };
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod cert");
}
